package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Sentinel errors; storage re-exports them as storage.ErrFormat,
// storage.ErrDType and storage.ErrTooLarge.
var (
	ErrFormat   = errors.New("invalid safetensors") // malformed header, sizes inconsistent
	ErrDType    = errors.New("unsupported dtype")   // a dtype unknown to the codec
	ErrTooLarge = errors.New("too large")           // over a limit (header length)
)

// MaxHeaderSize caps the JSON header's length, as the reference Rust
// implementation does (100 MB): a submitter cannot make a worker allocate
// more than this for one header.
const MaxHeaderSize = 100_000_000

// PrefixSize is the length of the little-endian uint64 header-length prefix.
const PrefixSize = 8

// MetadataKey is the header's reserved name for the string metadata.
const MetadataKey = "__metadata__"

// dtypeSizes are the element sizes of the safetensors dtypes with whole-byte
// elements. Sub-byte types (F4, F6_*) are not byte-addressable per element
// and are rejected as unknown.
var dtypeSizes = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8, "C64": 8,
}

// DTypeSize returns the size in bytes of one element of dtype, and whether
// the codec knows dtype.
func DTypeSize(dtype string) (int, bool) {
	n, ok := dtypeSizes[dtype]
	return n, ok
}

// KnownDTypes lists the dtypes the codec parses, sorted.
func KnownDTypes() []string {
	out := make([]string, 0, len(dtypeSizes))
	for k := range dtypeSizes {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Entry is one tensor of a parsed header. Begin and End are byte offsets
// relative to the start of the data section (Header.DataStart).
type Entry struct {
	Name       string
	DType      string
	Shape      []int
	Begin, End int64
}

// Size returns the tensor's length in bytes.
func (e Entry) Size() int64 { return e.End - e.Begin }

// Header is a parsed, validated safetensors header.
type Header struct {
	Entries   []Entry           // in data order (by Begin)
	Metadata  map[string]string // nil when the header has none
	DataStart int64             // absolute offset of the data section: 8 + header length
	Size      int64             // the object's total size the header was checked against
}

// Lookup returns the entry named name.
func (h *Header) Lookup(name string) (Entry, bool) {
	for _, e := range h.Entries {
		if e.Name == name {
			return e, true
		}
	}
	return Entry{}, false
}

// Names returns the tensor names in data order.
func (h *Header) Names() []string {
	out := make([]string, len(h.Entries))
	for i, e := range h.Entries {
		out[i] = e.Name
	}
	return out
}

// HeaderLength decodes the 8-byte prefix and checks the header length
// against MaxHeaderSize and, when objectSize >= 0, against the object.
func HeaderLength(prefix []byte, objectSize int64) (int64, error) {
	if len(prefix) < PrefixSize || (objectSize >= 0 && objectSize < PrefixSize) {
		return 0, fmt.Errorf("%w: object of %d bytes is shorter than the 8-byte header length prefix", ErrFormat, max(objectSize, int64(len(prefix))))
	}
	n := binary.LittleEndian.Uint64(prefix)
	if n > MaxHeaderSize {
		return 0, fmt.Errorf("%w: header length %d exceeds the safetensors format's cap of %d bytes (MaxHeaderSize, not a setting)", ErrTooLarge, n, MaxHeaderSize)
	}
	if n < 2 {
		return 0, fmt.Errorf("%w: header length %d is too short for a JSON object", ErrFormat, n)
	}
	if objectSize >= 0 && PrefixSize+int64(n) > objectSize {
		return 0, fmt.Errorf("%w: header length %d overruns the object (%d bytes)", ErrFormat, n, objectSize)
	}
	return int64(n), nil
}

// ReadHeader reads and parses the header of the size-byte object r.
func ReadHeader(r io.ReaderAt, size int64) (*Header, error) {
	var prefix [PrefixSize]byte
	if size < PrefixSize {
		return nil, fmt.Errorf("%w: object of %d bytes is shorter than the 8-byte header length prefix", ErrFormat, size)
	}
	if _, err := r.ReadAt(prefix[:], 0); err != nil {
		return nil, fmt.Errorf("read header length: %w", err)
	}
	n, err := HeaderLength(prefix[:], size)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, n)
	if _, err := r.ReadAt(buf, PrefixSize); err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	return ParseHeader(buf, size)
}

// MaxDims is the most dimensions a tensor's shape may have. The format
// sets no bound; this one keeps a hostile header's parse within ParseCost
// (tensors have a handful).
const MaxDims = 64

// SlowParseMax is the largest header ParseHeader hands to its reference
// parser (encoding/json) when the fast parser does not take it: the
// reference parser reports every error precisely but allocates some 25
// times the header's length, so above this length only headers in the form
// writers produce are accepted (see ParseCost).
const SlowParseMax = 1 << 20

// ParseCost bounds the bytes ParseHeader allocates, with the header's own
// bytes, for a header of n bytes: the fast parser stays within about 12 n
// (many tiny tensors, or many metadata keys), the reference parser, which
// only headers up to SlowParseMax reach, within about 35 n (TestParseCost
// builds the worst cases). A reader holding many headers at once accounts
// for them with it.
func ParseCost(n int64) int64 {
	if n <= SlowParseMax {
		return 40 * n
	}
	return 16 * n
}

// ParseHeader parses and validates the JSON header (the header-length bytes
// after the 8-byte prefix) of an object of objectSize bytes. With
// objectSize < 0 the size checks that need it are skipped and Size is set
// from the header.
func ParseHeader(header []byte, objectSize int64) (*Header, error) {
	if len(header) > MaxHeaderSize {
		return nil, fmt.Errorf("%w: header length %d exceeds the safetensors format's cap of %d bytes (MaxHeaderSize, not a setting)", ErrTooLarge, len(header), MaxHeaderSize)
	}
	if !utf8.Valid(header) {
		return nil, fmt.Errorf("%w: header is not valid UTF-8", ErrFormat)
	}
	if len(header) == 0 || header[0] != '{' {
		return nil, fmt.Errorf("%w: header does not start with '{'", ErrFormat)
	}
	h := &Header{DataStart: PrefixSize + int64(len(header))}
	var ok bool
	if h.Entries, h.Metadata, ok = fastParse(header); !ok {
		if len(header) > SlowParseMax {
			// encoding/json's tokens allocate some 25 times the header's
			// length: a large header is taken only in the form writers
			// produce, whose cost ParseCost bounds.
			return nil, fmt.Errorf("%w: a header over %d bytes (this one is %d) must be plain JSON as safetensors writers produce it: "+
				"no escapes in strings, integers only, no duplicate names", ErrFormat, SlowParseMax, len(header))
		}
		var err error
		if h.Entries, h.Metadata, err = parseSlow(header); err != nil {
			return nil, err
		}
	}
	// The tensors must tile the data section: sorted by offset, each begins
	// where the previous ended, the first at 0 and the last at the end of
	// the object. This rules out overlaps (two tensors sharing bytes), gaps
	// (hidden bytes) and objects longer or shorter than the header says.
	slices.SortStableFunc(h.Entries, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Begin, b.Begin), cmp.Compare(a.End, b.End))
	})
	var next int64
	for _, e := range h.Entries {
		if e.Begin != next {
			if e.Begin < next {
				return nil, fmt.Errorf("%w: tensor %q data_offsets [%d, %d] overlap the previous tensor, which ends at %d", ErrFormat, e.Name, e.Begin, e.End, next)
			}
			return nil, fmt.Errorf("%w: tensor %q begins at %d but the previous tensor ends at %d (gaps are not allowed)", ErrFormat, e.Name, e.Begin, next)
		}
		next = e.End
	}
	if h.DataStart > math.MaxInt64-next {
		return nil, fmt.Errorf("%w: data section end %d overflows", ErrFormat, next)
	}
	end := h.DataStart + next
	if objectSize >= 0 && end != objectSize {
		return nil, fmt.Errorf("%w: header describes %d bytes (8 + %d header + %d data) but the object is %d bytes", ErrFormat, end, len(header), next, objectSize)
	}
	h.Size = end
	return h, nil
}

// parseSlow is the reference parser, on encoding/json's tokens: it
// reports every way a header can be wrong. ParseHeader runs it when
// fastParse does not accept the header.
func parseSlow(header []byte) ([]Entry, map[string]string, error) {
	p := &parser{dec: json.NewDecoder(bytes.NewReader(header))}
	p.dec.UseNumber()
	var entries []Entry
	var meta map[string]string
	if err := p.delim('{', "header"); err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	for p.dec.More() {
		name, err := p.key("header")
		if err != nil {
			return nil, nil, err
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("%w: duplicate name %q in header", ErrFormat, name)
		}
		seen[name] = true
		if name == MetadataKey {
			if meta, err = p.metadata(); err != nil {
				return nil, nil, err
			}
			continue
		}
		e, err := p.entry(name)
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, e)
	}
	if err := p.delim('}', "header"); err != nil {
		return nil, nil, err
	}
	if rest := header[p.dec.InputOffset():]; len(strings.TrimLeft(string(rest), " \t\r\n")) != 0 {
		return nil, nil, fmt.Errorf("%w: %d bytes of trailing data after the header's JSON object", ErrFormat, len(rest))
	}
	return entries, meta, nil
}

type parser struct{ dec *json.Decoder }

func (p *parser) token(what string) (json.Token, error) {
	t, err := p.dec.Token()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: invalid JSON: %v", ErrFormat, what, err)
	}
	return t, nil
}

func (p *parser) delim(d json.Delim, what string) error {
	t, err := p.token(what)
	if err != nil {
		return err
	}
	if got, ok := t.(json.Delim); !ok || got != d {
		return fmt.Errorf("%w: %s: want %q, got %v", ErrFormat, what, d, describe(t))
	}
	return nil
}

func (p *parser) key(what string) (string, error) {
	t, err := p.token(what)
	if err != nil {
		return "", err
	}
	s, ok := t.(string)
	if !ok {
		return "", fmt.Errorf("%w: %s: want a name, got %v", ErrFormat, what, describe(t))
	}
	return s, nil
}

func (p *parser) metadata() (map[string]string, error) {
	t, err := p.token(MetadataKey)
	if err != nil {
		return nil, err
	}
	if t == nil { // "__metadata__": null, as optional metadata may be written
		return nil, nil
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%w: %s: want an object of strings, got %v", ErrFormat, MetadataKey, describe(t))
	}
	m := map[string]string{}
	for p.dec.More() {
		k, err := p.key(MetadataKey)
		if err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("%w: %s: duplicate key %q", ErrFormat, MetadataKey, k)
		}
		t, err := p.token(MetadataKey)
		if err != nil {
			return nil, err
		}
		v, ok := t.(string)
		if !ok {
			return nil, fmt.Errorf("%w: %s: value of %q must be a string, got %v", ErrFormat, MetadataKey, k, describe(t))
		}
		m[k] = v
	}
	return m, p.delim('}', MetadataKey)
}

func (p *parser) entry(name string) (Entry, error) {
	what := fmt.Sprintf("tensor %q", name)
	e := Entry{Name: name}
	if err := p.delim('{', what); err != nil {
		return e, err
	}
	var haveDType, haveShape, haveOffsets bool
	for p.dec.More() {
		field, err := p.key(what)
		if err != nil {
			return e, err
		}
		dup := false
		switch field {
		case "dtype":
			dup, haveDType = haveDType, true
			t, err := p.token(what)
			if err != nil {
				return e, err
			}
			s, ok := t.(string)
			if !ok {
				return e, fmt.Errorf("%w: %s: dtype must be a string, got %v", ErrFormat, what, describe(t))
			}
			e.DType = s
		case "shape":
			dup, haveShape = haveShape, true
			dims, err := p.ints(what, "shape", -1)
			if err != nil {
				return e, err
			}
			e.Shape = make([]int, len(dims))
			for i, d := range dims {
				if d > math.MaxInt {
					return e, fmt.Errorf("%w: %s: dimension %d is too large", ErrFormat, what, d)
				}
				e.Shape[i] = int(d)
			}
		case "data_offsets":
			dup, haveOffsets = haveOffsets, true
			offs, err := p.ints(what, "data_offsets", 2)
			if err != nil {
				return e, err
			}
			e.Begin, e.End = offs[0], offs[1]
		default:
			return e, fmt.Errorf("%w: %s: unknown field %q (want dtype, shape, data_offsets)", ErrFormat, what, field)
		}
		if dup {
			return e, fmt.Errorf("%w: %s: duplicate field %q", ErrFormat, what, field)
		}
	}
	if err := p.delim('}', what); err != nil {
		return e, err
	}
	switch {
	case !haveDType:
		return e, fmt.Errorf("%w: %s: missing dtype", ErrFormat, what)
	case !haveShape:
		return e, fmt.Errorf("%w: %s: missing shape", ErrFormat, what)
	case !haveOffsets:
		return e, fmt.Errorf("%w: %s: missing data_offsets", ErrFormat, what)
	}
	size, ok := DTypeSize(e.DType)
	if !ok {
		return e, fmt.Errorf("%w: %s: unknown dtype %q (known: %s)", ErrDType, what, e.DType, strings.Join(KnownDTypes(), ", "))
	}
	if e.End < e.Begin {
		return e, fmt.Errorf("%w: %s: data_offsets [%d, %d] end before they begin", ErrFormat, what, e.Begin, e.End)
	}
	n, err := ByteSize(e.Shape, size)
	if err != nil {
		return e, fmt.Errorf("%s: %w", what, err)
	}
	if n != e.End-e.Begin {
		return e, fmt.Errorf("%w: %s: data_offsets [%d, %d] span %d bytes but shape %v of %s needs %d", ErrFormat, what, e.Begin, e.End, e.End-e.Begin, e.Shape, e.DType, n)
	}
	return e, nil
}

// ints reads an array of non-negative decimal integers; want >= 0 fixes
// its length.
func (p *parser) ints(what, field string, want int) ([]int64, error) {
	if err := p.delim('[', what+" "+field); err != nil {
		return nil, err
	}
	out := []int64{}
	for p.dec.More() {
		t, err := p.token(what)
		if err != nil {
			return nil, err
		}
		num, ok := t.(json.Number)
		if !ok {
			return nil, fmt.Errorf("%w: %s: %s must hold integers, got %v", ErrFormat, what, field, describe(t))
		}
		v, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil || v < 0 || strings.HasPrefix(string(num), "-") {
			return nil, fmt.Errorf("%w: %s: %s value %s is not a non-negative integer that fits in int64", ErrFormat, what, field, num)
		}
		out = append(out, v)
		if want < 0 && len(out) > MaxDims {
			return nil, fmt.Errorf("%w: %s: %s has more than %d dimensions", ErrFormat, what, field, MaxDims)
		}
	}
	if err := p.delim(']', what+" "+field); err != nil {
		return nil, err
	}
	if want >= 0 && len(out) != want {
		return nil, fmt.Errorf("%w: %s: %s has %d values, want %d", ErrFormat, what, field, len(out), want)
	}
	return out, nil
}

// ByteSize returns prod(shape) * elemSize, or ErrFormat when a dimension is
// negative or the product overflows an int64.
func ByteSize(shape []int, elemSize int) (int64, error) {
	n := uint64(elemSize)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("%w: negative dimension %d in shape %v", ErrFormat, d, shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("%w: shape %v of %d-byte elements overflows int64", ErrFormat, shape, elemSize)
		}
		n = lo
	}
	return int64(n), nil
}

func describe(t json.Token) string {
	switch v := t.(type) {
	case nil:
		return "null"
	case json.Delim:
		return strconv.Quote(v.String())
	case string:
		return "string " + strconv.Quote(v)
	case json.Number:
		return "number " + v.String()
	case bool:
		return "bool " + strconv.FormatBool(v)
	}
	return fmt.Sprintf("%v", t)
}
