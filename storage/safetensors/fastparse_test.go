package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"
)

// FuzzFastParse checks fastParse against the reference parser: whatever
// the fast parser accepts, parseSlow accepts with the same entries and
// metadata (so ParseHeader is as strict as parseSlow alone).
func FuzzFastParse(f *testing.F) {
	for _, s := range []string{
		`{"__metadata__":{"producer":"rmsgrad","sha256.dx":"00"},"dx":{"dtype":"F32","shape":[8,1024],"data_offsets":[0,32768]},"dw":{"dtype":"F32","shape":[1024],"data_offsets":[32768,36864]}}  `,
		`{"a":{"dtype":"F16","shape":[],"data_offsets":[0,2]}}`,
		`{"__metadata__":null}`,
		`{"__metadata__":{}}`,
		`{}`,
		` {}`,
		"{}\x00",
		`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`,
		`{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}`,
		`{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}`,
		`{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,4]}}`,
		`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],}}`,
		`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},}`,
		`{"a" : { "dtype" : "U8" , "shape" : [ 3 ] , "data_offsets" : [ 0 , 3 ] } }` + "\n\t",
		`{"\u0061":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`,
		`{"__metadata__":{"k":"v"},"__metadata__":null}`,
		`{"é":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}`,
		`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`,
		`{"a":{"dtype":"U8","shape":[1],"data_offsets":[999999999999999999,1000000000000000000]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, header []byte) {
		if !utf8.Valid(header) || len(header) == 0 || header[0] != '{' {
			return // ParseHeader rejects these before either parser runs
		}
		fe, fm, ok := fastParse(header)
		se, sm, err := parseSlow(header)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("fastParse accepted %q, parseSlow rejects it: %v", header, err)
		}
		if !reflect.DeepEqual(fe, se) || !reflect.DeepEqual(fm, sm) {
			t.Fatalf("parsers disagree on %q:\nfast %#v %#v\nslow %#v %#v", header, fe, fm, se, sm)
		}
	})
}

// TestFastParseTakesWriterHeaders: the headers this codec writes take the
// fast path.
func TestFastParseTakesWriterHeaders(t *testing.T) {
	h, err := EncodeHeader([]Tensor{F32("dx", []int{2, 3}, make([]float32, 6)), F32("dw", []int{3}, make([]float32, 3))},
		map[string]string{"producer": "rmsgrad", "sha256.dx": "ab", "eps": "1e-06"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := fastParse(h[PrefixSize:]); !ok {
		t.Fatalf("fastParse falls back on %q", h[PrefixSize:])
	}
}

// FuzzAppendJSONString: the encoder's strings are byte for byte what
// encoding/json writes.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "dx", "sha256.dx", "a\"b", `a\b`, "<&>", "é", "\x7f", "\x00", "\u2028", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendJSONString(nil, s); string(got) != string(want) {
			t.Fatalf("appendJSONString(%q) = %s, want %s", s, got, want)
		}
	})
}

// TestEncodeHeaderBytes pins the encoder's output.
func TestEncodeHeaderBytes(t *testing.T) {
	h, err := EncodeHeader([]Tensor{F32("dx", []int{2, 3}, make([]float32, 6)), {Name: "m", DType: "U8", Shape: []int{}, Data: []byte{1}}},
		map[string]string{"producer": "rmsgrad", "eps": "1e-06", "q": `a"<`})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"__metadata__":{"eps":"1e-06","producer":"rmsgrad","q":"a\"\u003c"},"dx":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"m":{"dtype":"U8","shape":[],"data_offsets":[24,25]}}`
	for (len(want))%8 != 0 {
		want += " "
	}
	if got := string(h[PrefixSize:]); got != want || binary.LittleEndian.Uint64(h) != uint64(len(want)) {
		t.Fatalf("header\n%q\nwant\n%q", got, want)
	}
}
