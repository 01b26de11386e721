package jobs

import (
	"strconv"
)

// decodeFast parses the payloads Client writes (json.Marshal of a Job)
// without encoding/json: exact lowercase keys, each once, strings of
// printable ASCII without escapes, integers and JSON numbers, an outputs
// array of such strings. It accepts a payload only when decodeSlow would
// accept it with the same Job; anything else (an escape, a non-ASCII byte,
// null, an unknown, duplicate or case-folded key, a wrong type, a number
// out of range) returns ok=false and Decode runs decodeSlow, which reports
// the error as before. FuzzDecodeFast checks that agreement.
func decodeFast(payload []byte) (j Job, ok bool) {
	p := payloadParser{b: payload}
	if !p.byte('{') {
		return Job{}, false
	}
	var seen uint16
	if p.peek() == '}' {
		p.i++
	} else {
		for {
			key, ok := p.str()
			if !ok || !p.byte(':') {
				return Job{}, false
			}
			bit := uint16(0)
			switch key {
			case "v":
				bit = 1 << 0
				v, ok := p.integer()
				if !ok || int64(int(v)) != v {
					return Job{}, false
				}
				j.V = int(v)
			case "x":
				bit = 1 << 1
				j.X, ok = p.str()
			case "w":
				bit = 1 << 2
				j.W, ok = p.str()
			case "dy":
				bit = 1 << 3
				j.DY, ok = p.str()
			case "out":
				bit = 1 << 4
				j.Out, ok = p.str()
			case "eps":
				bit = 1 << 5
				j.Eps, ok = p.float()
			case "outputs":
				bit = 1 << 6
				j.Outputs, ok = p.strs()
			case "enqueued_ns":
				bit = 1 << 7
				j.EnqueuedNS, ok = p.integer()
			case "sig":
				bit = 1 << 8
				j.Sig, ok = p.str()
			default:
				return Job{}, false
			}
			if !ok || seen&bit != 0 {
				return Job{}, false
			}
			seen |= bit
			c := p.peek()
			p.i++
			if c == '}' {
				break
			}
			if c != ',' {
				return Job{}, false
			}
		}
	}
	p.peek()
	if p.i != len(p.b) {
		return Job{}, false
	}
	return j, true
}

type payloadParser struct {
	b []byte
	i int
}

// peek skips JSON whitespace and returns the next byte, 0 at the end (a
// NUL byte is never valid JSON outside a string: callers fall back on it).
func (p *payloadParser) peek() byte {
	for p.i < len(p.b) {
		switch c := p.b[p.i]; c {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return c
		}
	}
	return 0
}

func (p *payloadParser) byte(c byte) bool {
	if p.peek() != c {
		return false
	}
	p.i++
	return true
}

// str reads a string of printable ASCII without escapes.
func (p *payloadParser) str() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i
	for ; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			s := string(p.b[start:p.i])
			p.i++
			return s, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return "", false
		}
	}
	return "", false
}

// strs reads an array of strings ([] is an empty, non-nil slice, as
// encoding/json makes it).
func (p *payloadParser) strs() ([]string, bool) {
	if !p.byte('[') {
		return nil, false
	}
	out := make([]string, 0, 3)
	if p.peek() == ']' {
		p.i++
		return out, true
	}
	for {
		s, ok := p.str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		c := p.peek()
		p.i++
		if c == ']' {
			return out, true
		}
		if c != ',' {
			return nil, false
		}
	}
}

// number returns the bytes of a JSON number (RFC 8259 grammar).
func (p *payloadParser) number() ([]byte, bool) {
	p.peek()
	start, b := p.i, p.b
	i := p.i
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
	p.i = i
	return b[start:i], true
}

// integer reads a JSON number that strconv.ParseInt takes, as
// encoding/json does for an int64 field (no fraction, no exponent).
func (p *payloadParser) integer() (int64, bool) {
	s, ok := p.number()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(string(s), 10, 64)
	return v, err == nil
}

// float reads a JSON number into a float64 as encoding/json does
// (strconv.ParseFloat; out of range is an error there, a fallback here).
func (p *payloadParser) float() (float64, bool) {
	s, ok := p.number()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(s), 64)
	return v, err == nil
}
