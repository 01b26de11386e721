package gateway

import (
	"github.com/rmsgrad/rmsgrad/internal/jsonscan"
)

// splitBatch reads the plain form of a batch body that clients write,
// {"jobs":[{"id":"...","job":{...}},...]} (ids without escapes, keys
// exactly these, each once), without encoding/json, which cost an eighth
// of the gateway's CPU on a batch (BenchmarkBatchSubmit). Each job's bytes
// are returned as they are, for jobs.Decode. Anything else returns
// ok=false and the caller decodes the body with encoding/json, which
// reports what is wrong. A job's own bytes are only delimited here, not
// validated: when a job is refused, the caller checks the whole body with
// json.Valid, so a malformed body is answered the same either way.
func splitBatch(body []byte) (items []batchItem, ok bool) {
	s := jsonscan.Scanner{B: body}
	if !s.Byte('{') {
		return nil, false
	}
	if k, ok := s.StrBytes(true); !ok || string(k) != "jobs" || !s.Byte(':') || !s.Byte('[') {
		return nil, false
	}
	if s.Peek() == ']' {
		s.I++
	} else {
		for {
			it, ok := splitItem(&s)
			if !ok {
				return nil, false
			}
			items = append(items, it)
			if s.Byte(',') {
				continue
			}
			if !s.Byte(']') {
				return nil, false
			}
			break
		}
	}
	if !s.Byte('}') || s.Peek() != 0 {
		return nil, false
	}
	return items, true
}

// splitItem reads {"id":"...","job":{...}} (id optional, either order).
func splitItem(s *jsonscan.Scanner) (it batchItem, ok bool) {
	if !s.Byte('{') {
		return it, false
	}
	var haveID, haveJob bool
	for {
		k, ok := s.StrBytes(true)
		if !ok || !s.Byte(':') {
			return it, false
		}
		switch string(k) {
		case "id":
			v, ok := s.StrBytes(true)
			if !ok || haveID {
				return it, false
			}
			it.ID, haveID = string(v), true
		case "job":
			if haveJob || s.Peek() != '{' {
				return it, false
			}
			start := s.I
			end, ok := skipObject(s.B, start)
			if !ok {
				return it, false
			}
			it.Job, haveJob, s.I = s.B[start:end:end], true, end
		default:
			return it, false
		}
		if s.Byte(',') {
			continue
		}
		return it, s.Byte('}') && haveJob
	}
}

// skipObject returns the end of the JSON object starting at b[i] ('{'):
// brackets are counted outside strings, whose escapes are skipped.
func skipObject(b []byte, i int) (int, bool) {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1, true
			}
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		}
	}
	return 0, false
}
