package jobs

import (
	"strconv"

	"github.com/rmsgrad/rmsgrad/internal/jsonscan"
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
	p := payloadParser{jsonscan.Scanner{B: payload}}
	if !p.Byte('{') {
		return Job{}, false
	}
	var seen uint16
	if p.Peek() == '}' {
		p.I++
	} else {
		for {
			key, ok := p.str()
			if !ok || !p.Byte(':') {
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
			case "grad_dtype":
				bit = 1 << 9
				j.GradDType, ok = p.str()
			case "w_sha256":
				bit = 1 << 10
				j.WSHA256, ok = p.str()
			default:
				return Job{}, false
			}
			if !ok || seen&bit != 0 {
				return Job{}, false
			}
			seen |= bit
			c := p.Peek()
			p.I++
			if c == '}' {
				break
			}
			if c != ',' {
				return Job{}, false
			}
		}
	}
	p.Peek()
	if p.I != len(p.B) {
		return Job{}, false
	}
	return j, true
}

type payloadParser struct{ jsonscan.Scanner }

// str reads a string of printable ASCII without escapes.
func (p *payloadParser) str() (string, bool) {
	b, ok := p.StrBytes(true)
	return string(b), ok
}

// strs reads an array of strings ([] is an empty, non-nil slice, as
// encoding/json makes it).
func (p *payloadParser) strs() ([]string, bool) {
	if !p.Byte('[') {
		return nil, false
	}
	out := make([]string, 0, 3)
	if p.Peek() == ']' {
		p.I++
		return out, true
	}
	for {
		s, ok := p.str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		c := p.Peek()
		p.I++
		if c == ']' {
			return out, true
		}
		if c != ',' {
			return nil, false
		}
	}
}

// integer reads a JSON number that strconv.ParseInt takes, as
// encoding/json does for an int64 field (no fraction, no exponent).
func (p *payloadParser) integer() (int64, bool) {
	s, ok := p.Number()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(string(s), 10, 64)
	return v, err == nil
}

// float reads a JSON number into a float64 as encoding/json does
// (strconv.ParseFloat; out of range is an error there, a fallback here).
func (p *payloadParser) float() (float64, bool) {
	s, ok := p.Number()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(s), 64)
	return v, err == nil
}
