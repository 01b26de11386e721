package jsonscan

import (
	"encoding/json"
	"testing"
)

func TestStrBytes(t *testing.T) {
	for _, c := range []struct {
		in         string
		ascii      bool
		want       string
		ok         bool
		restOffset int
	}{
		{` "abc",`, true, "abc", true, 6},
		{`"a\"b"`, true, "", false, 0},
		{"\"a\tb\"", true, "", false, 0},
		{`"é"`, true, "", false, 0},
		{`"é"`, false, "é", true, 4},
		{`"unterminated`, false, "", false, 0},
		{`x"a"`, false, "", false, 0},
	} {
		s := Scanner{B: []byte(c.in)}
		got, ok := s.StrBytes(c.ascii)
		if ok != c.ok || string(got) != c.want || (ok && s.I != c.restOffset) {
			t.Errorf("StrBytes(%q, ascii=%v) = %q, %v at %d; want %q, %v at %d", c.in, c.ascii, got, ok, s.I, c.want, c.ok, c.restOffset)
		}
	}
}

func TestNumberMatchesEncodingJSON(t *testing.T) {
	for _, in := range []string{"0", "-0", "12", "-12.5", "1e9", "1E+2", "2.5e-3", "01", "1.", ".5", "-", "1e", "+1", "1.e3", "--1"} {
		s := Scanner{B: []byte(in)}
		b, ok := s.Number()
		whole := ok && s.I == len(in)
		valid := json.Valid([]byte(in))
		if whole != valid {
			t.Errorf("Number(%q) = %q, %v (consumed %d); encoding/json valid=%v", in, b, ok, s.I, valid)
		}
	}
}

func TestPeekAndByte(t *testing.T) {
	s := Scanner{B: []byte(" \t\n\r{ }")}
	if !s.Byte('{') || s.Peek() != '}' || !s.Byte('}') || s.Peek() != 0 {
		t.Fatalf("scanner at %d", s.I)
	}
}
