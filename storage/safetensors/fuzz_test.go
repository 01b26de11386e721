package safetensors

import (
	"bytes"
	"testing"
)

// FuzzParseHeader feeds arbitrary objects to the parser. Whatever it
// accepts must satisfy the invariants readers rely on, and must survive a
// re-encode: same tensors, same bytes, same metadata.
func FuzzParseHeader(f *testing.F) {
	var good bytes.Buffer
	_ = Encode(&good, []Tensor{F32("x", []int{2, 2}, []float32{1, 2, 3, 4}), F32("w", []int{2}, []float32{5, 6})}, map[string]string{"k": "v"})
	f.Add(good.Bytes())
	f.Add(file(`{"a":{"dtype":"F16","shape":[],"data_offsets":[0,2]}}`, 2))
	f.Add(file(`{"__metadata__":null}`, 0))
	f.Fuzz(func(t *testing.T, obj []byte) {
		h, err := ReadHeader(bytes.NewReader(obj), int64(len(obj)))
		if err != nil {
			return
		}
		var next int64
		ts := make([]Tensor, 0, len(h.Entries))
		for _, e := range h.Entries {
			if e.Begin != next || e.End < e.Begin {
				t.Fatalf("accepted non-contiguous offsets %+v", h.Entries)
			}
			next = e.End
			size, _ := DTypeSize(e.DType)
			if n, err := ByteSize(e.Shape, size); err != nil || n != e.Size() {
				t.Fatalf("accepted %q with %d bytes for shape %v", e.Name, e.Size(), e.Shape)
			}
			ts = append(ts, Tensor{Name: e.Name, DType: e.DType, Shape: e.Shape, Data: obj[h.DataStart+e.Begin : h.DataStart+e.End]})
		}
		if h.DataStart+next != int64(len(obj)) {
			t.Fatalf("accepted data end %d for a %d-byte object", h.DataStart+next, len(obj))
		}
		var re bytes.Buffer
		if err := Encode(&re, ts, h.Metadata); err != nil {
			if len(ts) > 0 && ts[0].Name == "" {
				return // empty names parse (the format allows them) but we do not write them
			}
			for _, x := range ts {
				if x.Name == "" {
					return
				}
			}
			t.Fatalf("accepted header does not re-encode: %v", err)
		}
		h2, err := ReadHeader(bytes.NewReader(re.Bytes()), int64(re.Len()))
		if err != nil {
			t.Fatalf("re-encoded file does not parse: %v", err)
		}
		if len(h2.Entries) != len(h.Entries) || len(h2.Metadata) != len(h.Metadata) {
			t.Fatalf("round trip changed the header: %+v vs %+v", h2, h)
		}
		for i, e := range h2.Entries {
			if e.Name != h.Entries[i].Name || !bytes.Equal(re.Bytes()[h2.DataStart+e.Begin:h2.DataStart+e.End], ts[i].Data) {
				t.Fatalf("round trip changed tensor %q", e.Name)
			}
		}
	})
}
