package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Tensor is one tensor to encode: its bytes are little-endian elements of
// DType, len(Data) == prod(Shape) * sizeof(DType). storage.OutTensor is this
// type.
type Tensor struct {
	Name  string
	DType string
	Shape []int
	Data  []byte
}

// F32 builds an F32 tensor from values (copied into little-endian bytes),
// for tools that write input files from Go slices.
func F32(name string, shape []int, values []float32) Tensor {
	data := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return Tensor{Name: name, DType: "F32", Shape: append([]int(nil), shape...), Data: data}
}

// EncodeHeader returns the 8-byte length prefix followed by the JSON header
// for ts (in that data order) and meta, padded with spaces to a multiple of
// 8 bytes so the data section is 8-byte aligned. It checks what a reader
// will check: unique non-empty names, known dtypes, and len(Data) matching
// each shape.
func EncodeHeader(ts []Tensor, meta map[string]string) ([]byte, error) {
	var b strings.Builder
	b.WriteString("{")
	first := true
	comma := func() {
		if !first {
			b.WriteString(",")
		}
		first = false
	}
	if len(meta) > 0 {
		keys := make([]string, 0, len(meta))
		for k := range meta {
			keys = append(keys, k)
		}
		sort.Strings(keys) // deterministic bytes for the same inputs
		comma()
		b.WriteString(jsonString(MetadataKey) + ":{")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(jsonString(k) + ":" + jsonString(meta[k]))
		}
		b.WriteString("}")
	}
	seen := make(map[string]bool, len(ts))
	var off int64
	for _, t := range ts {
		if t.Name == "" || t.Name == MetadataKey {
			return nil, fmt.Errorf("%w: tensor name %q is reserved or empty", ErrFormat, t.Name)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("%w: duplicate tensor name %q", ErrFormat, t.Name)
		}
		seen[t.Name] = true
		size, ok := DTypeSize(t.DType)
		if !ok {
			return nil, fmt.Errorf("%w: tensor %q: unknown dtype %q (known: %s)", ErrDType, t.Name, t.DType, strings.Join(KnownDTypes(), ", "))
		}
		n, err := ByteSize(t.Shape, size)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		if n != int64(len(t.Data)) {
			return nil, fmt.Errorf("%w: tensor %q: shape %v of %s needs %d bytes, data has %d", ErrFormat, t.Name, t.Shape, t.DType, n, len(t.Data))
		}
		comma()
		b.WriteString(jsonString(t.Name) + `:{"dtype":` + jsonString(t.DType) + `,"shape":[`)
		for i, d := range t.Shape {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(strconv.Itoa(d))
		}
		b.WriteString(`],"data_offsets":[` + strconv.FormatInt(off, 10) + "," + strconv.FormatInt(off+n, 10) + "]}")
		off += n
	}
	b.WriteString("}")
	for b.Len()%8 != 0 {
		b.WriteString(" ")
	}
	if b.Len() > MaxHeaderSize {
		return nil, fmt.Errorf("%w: header length %d exceeds the limit of %d bytes", ErrTooLarge, b.Len(), MaxHeaderSize)
	}
	out := make([]byte, PrefixSize+b.Len())
	binary.LittleEndian.PutUint64(out, uint64(b.Len()))
	copy(out[PrefixSize:], b.String())
	return out, nil
}

// EncodedSize returns the length in bytes of the encoded file.
func EncodedSize(ts []Tensor, meta map[string]string) (int64, error) {
	h, err := EncodeHeader(ts, meta)
	if err != nil {
		return 0, err
	}
	n := int64(len(h))
	for _, t := range ts {
		n += int64(len(t.Data))
	}
	return n, nil
}

// Encode writes the safetensors file for ts and meta to w: the header, then
// each tensor's Data as is (no copies).
func Encode(w io.Writer, ts []Tensor, meta map[string]string) error {
	h, err := EncodeHeader(ts, meta)
	if err != nil {
		return err
	}
	if _, err := w.Write(h); err != nil {
		return err
	}
	for _, t := range ts {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}

func jsonString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}
