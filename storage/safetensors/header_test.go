package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// file builds an object from a raw JSON header and dataLen data bytes.
func file(header string, dataLen int) []byte {
	b := make([]byte, 8, 8+len(header)+dataLen)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, dataLen)...)
}

func TestParseHeaderMalformed(t *testing.T) {
	tooLong := make([]byte, 16)
	binary.LittleEndian.PutUint64(tooLong, MaxHeaderSize+1)
	overrun := make([]byte, 16)
	binary.LittleEndian.PutUint64(overrun, 100)
	cases := []struct {
		name string
		obj  []byte
		is   error
		want string
	}{
		{"short prefix", []byte{1, 2, 3}, ErrFormat, "shorter than the 8-byte"},
		{"header over limit", tooLong, ErrTooLarge, "exceeds the safetensors format's cap of 100000000 bytes"},
		{"header overruns object", overrun, ErrFormat, "overruns the object"},
		{"not json", file("{nope", 0), ErrFormat, "invalid JSON"},
		{"not an object", file(`["x"]  `, 0), ErrFormat, "does not start with '{'"},
		{"invalid utf8", file("{\"\xff\":1}", 0), ErrFormat, "UTF-8"},
		{"trailing data", file(`{} {}`, 0), ErrFormat, "trailing data"},
		{"duplicate tensor", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), ErrFormat, `duplicate name "a"`},
		{"duplicate field", file(`{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4), ErrFormat, `duplicate field "dtype"`},
		{"duplicate metadata key", file(`{"__metadata__":{"k":"1","k":"2"}}`, 0), ErrFormat, `duplicate key "k"`},
		{"metadata not string", file(`{"__metadata__":{"k":1}}`, 0), ErrFormat, "must be a string"},
		{"unknown field", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}`, 4), ErrFormat, `unknown field "x"`},
		{"missing dtype", file(`{"a":{"shape":[1],"data_offsets":[0,4]}}`, 4), ErrFormat, "missing dtype"},
		{"missing shape", file(`{"a":{"dtype":"F32","data_offsets":[0,4]}}`, 4), ErrFormat, "missing shape"},
		{"missing offsets", file(`{"a":{"dtype":"F32","shape":[1]}}`, 4), ErrFormat, "missing data_offsets"},
		{"unknown dtype", file(`{"a":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}}`, 4), ErrDType, "known: BF16"},
		{"negative dim", file(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4), ErrFormat, "non-negative integer"},
		{"fractional dim", file(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, 4), ErrFormat, "non-negative integer"},
		{"three offsets", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, 4), ErrFormat, "has 3 values, want 2"},
		{"offsets reversed", file(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, 4), ErrFormat, "end before they begin"},
		{"length mismatch", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4), ErrFormat, "needs 8"},
		{"shape overflow", file(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, 4), ErrFormat, "overflows int64"},
		{"offset overflow", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[9223372036854775807,9223372036854775808]}}`, 4), ErrFormat, "fits in int64"},
		{"overlap", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), ErrFormat, "overlap"},
		{"gap", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), ErrFormat, "gaps are not allowed"},
		{"out of bounds", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4), ErrFormat, "but the object is"},
		{"trailing bytes", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 12), ErrFormat, "but the object is"},
		// The half dtypes are held to their 2-byte elements.
		{"bf16 counted as f32", file(`{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}}`, 8), ErrFormat, "shape [2] of BF16 needs 4"},
		{"f16 short", file(`{"a":{"dtype":"F16","shape":[3],"data_offsets":[0,4]}}`, 4), ErrFormat, "shape [3] of F16 needs 6"},
		{"bf16 odd bytes", file(`{"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,3]}}`, 3), ErrFormat, "needs 2"},
		{"f16 overlap", file(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}}`, 4), ErrFormat, "overlap"},
		{"bf16 gap", file(`{"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"b":{"dtype":"F16","shape":[1],"data_offsets":[4,6]}}`, 6), ErrFormat, "gaps are not allowed"},
		{"f16 trailing byte", file(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, 5), ErrFormat, "but the object is"},
		{"bf16 shape overflow", file(`{"a":{"dtype":"BF16","shape":[4611686018427387904,2],"data_offsets":[0,4]}}`, 4), ErrFormat, "overflows int64"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadHeader(bytes.NewReader(c.obj), int64(len(c.obj)))
			if err == nil {
				t.Fatal("parsed a malformed header")
			}
			if !errors.Is(err, c.is) {
				t.Errorf("error %q does not match %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	ts := []Tensor{
		F32("x", []int{2, 3}, []float32{1, 2, 3, 4, 5, -6.5}),
		{Name: "b", DType: "BF16", Shape: []int{3}, Data: []byte{0x80, 0x3f, 0x00, 0xc0, 0xc0, 0x7f}},
		{Name: "h", DType: "F16", Shape: []int{1, 1}, Data: []byte{0x00, 0x3c}},
		{Name: "empty", DType: "F32", Shape: []int{0, 4}, Data: nil},
		F32("w", []int{3}, []float32{0.5, 0.25, 0.125}),
	}
	meta := map[string]string{"b": "2", "a": "\"quoted\" <&>"}
	var buf bytes.Buffer
	if err := Encode(&buf, ts, meta); err != nil {
		t.Fatal(err)
	}
	n, err := EncodedSize(ts, meta)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("EncodedSize = %d, %v; encoded %d bytes", n, err, buf.Len())
	}
	obj := buf.Bytes()
	h, err := ReadHeader(bytes.NewReader(obj), int64(len(obj)))
	if err != nil {
		t.Fatal(err)
	}
	if h.DataStart%8 != 0 {
		t.Errorf("data starts at %d, not 8-byte aligned", h.DataStart)
	}
	if h.Metadata["a"] != meta["a"] || h.Metadata["b"] != "2" || len(h.Metadata) != 2 {
		t.Errorf("metadata %v, want %v", h.Metadata, meta)
	}
	for _, want := range ts {
		e, ok := h.Lookup(want.Name)
		if !ok {
			t.Fatalf("tensor %q missing", want.Name)
		}
		got := obj[h.DataStart+e.Begin : h.DataStart+e.End]
		if !bytes.Equal(got, want.Data) || e.DType != want.DType || len(e.Shape) != len(want.Shape) {
			t.Errorf("tensor %q: got %v %v %x, want %v %v %x", want.Name, e.DType, e.Shape, got, want.DType, want.Shape, want.Data)
		}
	}
	// Same inputs, same bytes.
	var again bytes.Buffer
	_ = Encode(&again, ts, meta)
	if !bytes.Equal(again.Bytes(), obj) {
		t.Error("encoding is not deterministic")
	}
}

func TestEncodeRejects(t *testing.T) {
	for name, ts := range map[string][]Tensor{
		"duplicate":   {F32("a", []int{1}, []float32{1}), F32("a", []int{1}, []float32{1})},
		"short data":  {{Name: "a", DType: "F32", Shape: []int{2}, Data: make([]byte, 4)}},
		"bf16 as f32": {{Name: "a", DType: "BF16", Shape: []int{2}, Data: make([]byte, 8)}},
		"f16 short":   {{Name: "a", DType: "F16", Shape: []int{2}, Data: make([]byte, 3)}},
		"reserved":    {F32(MetadataKey, []int{1}, []float32{1})},
		"bad dtype":   {{Name: "a", DType: "Q4", Shape: []int{1}, Data: make([]byte, 1)}},
		"empty name":  {F32("", []int{1}, []float32{1})},
	} {
		if _, err := EncodeHeader(ts, nil); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}
