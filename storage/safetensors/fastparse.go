package safetensors

import "github.com/rmsgrad/rmsgrad/internal/jsonscan"

// fastParse is ParseHeader's hand-written parser for the headers writers
// produce: strings without escapes, non-negative integers in decimal, no
// null but __metadata__'s. It runs without encoding/json's reflection and
// token allocations (about a tenth of the time). It accepts a header only
// when it is sure the encoding/json parser (parseSlow) would accept it with
// the same result; on anything else (an escape, a fraction, an unknown or
// duplicate field, a bad value, a missing field, a wrong size) it returns
// ok=false and ParseHeader runs parseSlow, which reports the error exactly
// as before. FuzzFastParse checks that agreement.
//
// The caller has checked that header is valid UTF-8 and starts with '{'.
// The returned entries are in header order; ParseHeader sorts and tiles
// them. Every string it returns is a copy: nothing points into header.
func fastParse(header []byte) (entries []Entry, meta map[string]string, ok bool) {
	p := fastParser{jsonscan.Scanner{B: header}}
	if !p.Byte('{') {
		return nil, nil, false
	}
	var sawMeta bool
	var seen map[string]struct{} // names, once there are many
	if p.Peek() == '}' {
		p.I++
	} else {
		for {
			name, ok := p.str()
			if !ok || !p.Byte(':') {
				return nil, nil, false
			}
			if name == MetadataKey {
				if sawMeta {
					return nil, nil, false
				}
				sawMeta = true
				if meta, ok = p.metadata(); !ok {
					return nil, nil, false
				}
			} else {
				if seen == nil && len(entries) >= 16 {
					seen = make(map[string]struct{}, 2*len(entries))
					for _, e := range entries {
						seen[e.Name] = struct{}{}
					}
				}
				if seen != nil {
					if _, dup := seen[name]; dup {
						return nil, nil, false
					}
					seen[name] = struct{}{}
				} else {
					for _, e := range entries {
						if e.Name == name {
							return nil, nil, false
						}
					}
				}
				e, ok := p.entry(name)
				if !ok {
					return nil, nil, false
				}
				entries = append(entries, e)
			}
			c := p.Peek()
			p.I++
			if c == '}' {
				break
			}
			if c != ',' {
				return nil, nil, false
			}
		}
	}
	// Only JSON whitespace may follow the object.
	p.Peek()
	if p.I != len(p.B) {
		return nil, nil, false
	}
	return entries, meta, true
}

type fastParser struct{ jsonscan.Scanner }

// str reads a string without escapes or control characters (bytes >= 0x80
// are fine: the header was checked to be valid UTF-8).
func (p *fastParser) str() (string, bool) {
	b, ok := p.StrBytes(false)
	return string(b), ok
}

// metadata reads null or an object of string values with unique keys.
func (p *fastParser) metadata() (map[string]string, bool) {
	switch p.Peek() {
	case 'n':
		if len(p.B)-p.I >= 4 && string(p.B[p.I:p.I+4]) == "null" {
			p.I += 4
			return nil, true
		}
		return nil, false
	case '{':
		p.I++
	default:
		return nil, false
	}
	m := map[string]string{}
	if p.Peek() == '}' {
		p.I++
		return m, true
	}
	for {
		k, ok := p.str()
		if !ok || !p.Byte(':') {
			return nil, false
		}
		if _, dup := m[k]; dup {
			return nil, false
		}
		v, ok := p.str()
		if !ok {
			return nil, false
		}
		m[k] = v
		c := p.Peek()
		p.I++
		if c == '}' {
			return m, true
		}
		if c != ',' {
			return nil, false
		}
	}
}

// entry reads {"dtype":..,"shape":[..],"data_offsets":[a,b]} in any order,
// each exactly once, and checks it as parseSlow's entry does.
func (p *fastParser) entry(name string) (Entry, bool) {
	e := Entry{Name: name}
	if !p.Byte('{') {
		return e, false
	}
	var haveDType, haveShape, haveOffsets bool
	for {
		field, ok := p.StrBytes(false)
		if !ok || !p.Byte(':') {
			return e, false
		}
		switch string(field) {
		case "dtype":
			if haveDType {
				return e, false
			}
			haveDType = true
			d, ok := p.StrBytes(false)
			if !ok {
				return e, false
			}
			e.DType = internDType(d)
		case "shape":
			if haveShape {
				return e, false
			}
			haveShape = true
			e.Shape = make([]int, 0, 4)
			ok := p.ints(func(v int64) bool {
				e.Shape = append(e.Shape, int(v))
				return len(e.Shape) <= MaxDims
			})
			if !ok {
				return e, false
			}
		case "data_offsets":
			if haveOffsets {
				return e, false
			}
			haveOffsets = true
			n := 0
			ok := p.ints(func(v int64) bool {
				switch n {
				case 0:
					e.Begin = v
				case 1:
					e.End = v
				}
				n++
				return n <= 2
			})
			if !ok || n != 2 {
				return e, false
			}
		default:
			return e, false
		}
		c := p.Peek()
		p.I++
		if c == '}' {
			break
		}
		if c != ',' {
			return e, false
		}
	}
	if !haveDType || !haveShape || !haveOffsets {
		return e, false
	}
	size, ok := DTypeSize(e.DType)
	if !ok || e.End < e.Begin {
		return e, false
	}
	n, err := ByteSize(e.Shape, size)
	if err != nil || n != e.End-e.Begin {
		return e, false
	}
	return e, true
}

// ints reads an array of integers 0 or [1-9][0-9]* that fit in an int64
// (int is 64 bits wherever the worker runs; a dimension above MaxInt
// falls back), handing each to add, and stops (false) when add says so.
func (p *fastParser) ints(add func(int64) bool) bool {
	if !p.Byte('[') {
		return false
	}
	if p.Peek() == ']' {
		p.I++
		return true
	}
	for {
		if p.Peek() == 0 {
			return false
		}
		start := p.I
		var v uint64
		for p.I < len(p.B) && p.B[p.I] >= '0' && p.B[p.I] <= '9' {
			v = v*10 + uint64(p.B[p.I]-'0')
			p.I++
			if p.I-start > 18 { // 19+ digits may overflow: leave it to strconv
				return false
			}
		}
		if p.I == start || (p.B[start] == '0' && p.I-start > 1) || uint64(int(v)) != v || int(v) < 0 {
			return false
		}
		if !add(int64(v)) {
			return false
		}
		c := p.Peek()
		p.I++
		if c == ']' {
			return true
		}
		if c != ',' {
			return false
		}
	}
}

// internDType returns the codec's own string for a known dtype, so an
// entry does not allocate one; unknown dtypes are copied.
func internDType(b []byte) string {
	for _, d := range dtypeNames {
		if string(b) == d {
			return d
		}
	}
	return string(b)
}

var dtypeNames = func() []string {
	out := KnownDTypes()
	// F32 first: it is what the workers read.
	for i, d := range out {
		if d == "F32" {
			out[0], out[i] = out[i], out[0]
		}
	}
	return out
}()
