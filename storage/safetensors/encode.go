package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
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
	// Built in place behind the 8-byte prefix, with strconv's appends: the
	// worker encodes two headers per job.
	b := make([]byte, PrefixSize, PrefixSize+128+64*len(meta)+96*len(ts))
	b = append(b, '{')
	first := true
	comma := func() {
		if !first {
			b = append(b, ',')
		}
		first = false
	}
	if len(meta) > 0 {
		var small [8]string
		keys := small[:0]
		for k := range meta {
			keys = append(keys, k)
		}
		slices.Sort(keys) // deterministic bytes for the same inputs
		comma()
		b = appendJSONString(b, MetadataKey)
		b = append(b, ':', '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendJSONString(b, meta[k])
		}
		b = append(b, '}')
	}
	var off int64
	for i, t := range ts {
		if t.Name == "" || t.Name == MetadataKey {
			return nil, fmt.Errorf("%w: tensor name %q is reserved or empty", ErrFormat, t.Name)
		}
		for _, u := range ts[:i] {
			if u.Name == t.Name {
				return nil, fmt.Errorf("%w: duplicate tensor name %q", ErrFormat, t.Name)
			}
		}
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
		b = appendJSONString(b, t.Name)
		b = append(b, `:{"dtype":`...)
		b = appendJSONString(b, t.DType)
		b = append(b, `,"shape":[`...)
		for i, d := range t.Shape {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(d), 10)
		}
		b = append(b, `],"data_offsets":[`...)
		b = strconv.AppendInt(b, off, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, off+n, 10)
		b = append(b, ']', '}')
		off += n
	}
	b = append(b, '}')
	for (len(b)-PrefixSize)%8 != 0 {
		b = append(b, ' ')
	}
	n := len(b) - PrefixSize
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("%w: header length %d exceeds the safetensors format's cap of %d bytes (MaxHeaderSize, not a setting)", ErrTooLarge, n, MaxHeaderSize)
	}
	binary.LittleEndian.PutUint64(b, uint64(n))
	return b, nil
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

// appendJSONString appends s as encoding/json writes it: quoted as is
// when it is printable ASCII that json.Marshal would not escape, through
// json.Marshal otherwise.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
