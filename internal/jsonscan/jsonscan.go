// Package jsonscan is the byte scanner under rmsgrad's hand-written JSON
// fast paths (jobs' payload decoder, safetensors' header parser). It reads
// only the plain forms those producers write: strings without escapes or
// control characters, RFC 8259 numbers. Anything else reports false and the
// caller falls back on encoding/json, which stays the reference.
package jsonscan

// Scanner reads B from offset I.
type Scanner struct {
	B []byte
	I int
}

// Peek skips JSON whitespace and returns the next byte, 0 at the end (a NUL
// byte is never valid JSON outside a string, so callers treat it as the end
// and fall back).
func (s *Scanner) Peek() byte {
	for s.I < len(s.B) {
		switch c := s.B[s.I]; c {
		case ' ', '\t', '\n', '\r':
			s.I++
		default:
			return c
		}
	}
	return 0
}

// Byte consumes c after optional whitespace.
func (s *Scanner) Byte(c byte) bool {
	if s.Peek() != c {
		return false
	}
	s.I++
	return true
}

// StrBytes reads a string without escapes or control characters and returns
// its bytes (a slice of B). ascii also refuses bytes >= 0x7f.
func (s *Scanner) StrBytes(ascii bool) ([]byte, bool) {
	if !s.Byte('"') {
		return nil, false
	}
	start := s.I
	for ; s.I < len(s.B); s.I++ {
		switch c := s.B[s.I]; {
		case c == '"':
			out := s.B[start:s.I]
			s.I++
			return out, true
		case c == '\\' || c < 0x20 || (ascii && c >= 0x7f):
			return nil, false
		}
	}
	return nil, false
}

// Number returns the bytes of a JSON number (RFC 8259 grammar).
func (s *Scanner) Number() ([]byte, bool) {
	s.Peek()
	b, i := s.B, s.I
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return nil, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return nil, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return nil, false
		}
	}
	s.I = i
	return b[start:i], true
}
