package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/storage"
)

// refBackend is a small pure-Go compute.Backend for these tests (the real
// CPU backend lives in compute/cpu, which jobs must not import). fail, when
// set, is asked before each Execute and can fail it; execs counts calls and
// lastOps records each command buffer's op count.
type refBackend struct {
	fail  func(ops []compute.Op) error
	delay time.Duration
	execs atomic.Int64
	mu    sync.Mutex
	sizes []int // jobs (rms_inv ops) per Execute
}

type refBuf struct {
	dt    compute.DType
	shape []int
	n     int
	raw   []byte // n elements of dt, 4-byte aligned
}

func (b *refBuf) DType() compute.DType { return b.dt }
func (b *refBuf) Shape() []int         { return b.shape }
func (b *refBuf) Len() int             { return b.n }
func (b *refBuf) Release()             {}
func (b *refBuf) Bytes() []byte        { return b.raw }
func (b *refBuf) Float32s() []float32 {
	if b.dt != compute.F32 || b.n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b.raw[0])), b.n)
}

// newRefBuf allocates a refBuf with 4-byte aligned memory.
func newRefBuf(dt compute.DType, shape []int, n int) *refBuf {
	w := make([]float32, (n*dt.Size()+3)/4)
	var raw []byte
	if len(w) > 0 {
		raw = unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n*dt.Size())
	}
	return &refBuf{dt: dt, shape: slices.Clone(shape), n: n, raw: raw}
}

func (r *refBackend) Name() string       { return "ref" }
func (r *refBackend) DeviceName() string { return "test reference" }
func (r *refBackend) Close() error       { return nil }
func (r *refBackend) Alloc(dt compute.DType, shape ...int) (compute.Buffer, error) {
	n := compute.NumElements(shape)
	if n < 0 {
		return nil, fmt.Errorf("bad shape %v", shape)
	}
	return newRefBuf(dt, shape, n), nil
}

func (r *refBackend) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	r.execs.Add(1)
	jobs := 0
	for _, op := range ops {
		if op.Kind == compute.OpRMSInv {
			jobs++
		}
	}
	r.mu.Lock()
	r.sizes = append(r.sizes, jobs)
	r.mu.Unlock()
	if r.fail != nil {
		if err := r.fail(ops); err != nil {
			return 0, err
		}
	}
	if r.delay > 0 {
		time.Sleep(r.delay)
	}
	t0 := time.Now()
	for _, op := range ops {
		refOp(op)
	}
	return time.Since(t0), nil
}

func (r *refBackend) batchSizes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sizes)
}

// refOp is the seed's math in a fixed summation order (float64
// accumulators), so results are bitwise reproducible. Buffers of any
// dtype are read widened to float32 and written rounded to their dtype.
func refOp(op compute.Op) {
	d := op.Dim
	get := func(b compute.Buffer) []float32 {
		v := make([]float32, b.Len())
		b.DType().Decode(v, b.Bytes())
		return v
	}
	put := func(b compute.Buffer, v []float32) { b.DType().Encode(b.Bytes(), v) }
	switch op.Kind {
	case compute.OpRMSInv:
		x, r := get(op.X), get(op.R)
		for b := 0; b < op.Rows; b++ {
			var s float64
			for _, v := range x[b*d : (b+1)*d] {
				s += float64(v) * float64(v)
			}
			r[b] = float32(1 / math.Sqrt(s/float64(d)+float64(op.Eps())))
		}
		put(op.R, r)
	case compute.OpDX:
		x, w, dy, r, dx := get(op.X), get(op.W), get(op.DY), get(op.R), get(op.DX)
		for b := 0; b < op.Rows; b++ {
			var s float64
			for i := 0; i < d; i++ {
				s += float64(dy[b*d+i]) * float64(x[b*d+i]) * float64(w[i])
			}
			rb := float64(r[b])
			for k := 0; k < d; k++ {
				dx[b*d+k] = float32(rb * (float64(dy[b*d+k])*float64(w[k]) - float64(x[b*d+k])*s*rb*rb/float64(d)))
			}
		}
		put(op.DX, dx)
	case compute.OpDW:
		x, dy, r, dw := get(op.X), get(op.DY), get(op.R), get(op.DW)
		for i := 0; i < d; i++ {
			var s float64
			for b := 0; b < op.Rows; b++ {
				s += float64(dy[b*d+i]) * float64(x[b*d+i]) * float64(r[b])
			}
			dw[i] = float32(s)
		}
		put(op.DW, dw)
	}
}

// memTensor is one stored tensor.
type memTensor struct {
	dtype string
	shape []int
	data  []byte
}

// memStore is an in-memory Store: uris map to tensors; allow restricts
// Check to URIs with one of its prefixes. Written objects are kept per uri.
type memStore struct {
	mu      sync.Mutex
	tensors map[string]memTensor
	outs    map[string][]OutTensor
	writes  map[string]int
	allow   []string
	headErr func(uri string) error
	headCtx func(ctx context.Context, uri string) error // asked before headErr
	heads   map[string]int                              // Heads made, per uri
	// presummed counts outputs written with the batcher's digest.
	presummed atomic.Int64
}

func newMemStore(allow ...string) *memStore {
	return &memStore{tensors: map[string]memTensor{}, outs: map[string][]OutTensor{}, writes: map[string]int{}, allow: allow}
}

func (s *memStore) put(uri string, shape []int, v []float32) {
	s.putAs(uri, compute.F32, shape, v)
}

// putAs stores v, rounded to dt, as a tensor of dtype dt.
func (s *memStore) putAs(uri string, dt compute.DType, shape []int, v []float32) {
	b := make([]byte, dt.Size()*len(v))
	dt.Encode(b, v)
	s.mu.Lock()
	s.tensors[uri] = memTensor{dtype: string(dt), shape: shape, data: b}
	s.mu.Unlock()
}

func (s *memStore) Check(uri string, write bool) error {
	for _, p := range s.allow {
		if len(uri) >= len(p) && uri[:len(p)] == p {
			return nil
		}
	}
	return fmt.Errorf("%s: %w", uri, storage.ErrNotAllowed)
}

func (s *memStore) Head(ctx context.Context, uri string) (TensorInfo, error) {
	if s.headCtx != nil {
		if err := s.headCtx(ctx, uri); err != nil {
			return TensorInfo{}, err
		}
	}
	if s.headErr != nil {
		if err := s.headErr(uri); err != nil {
			return TensorInfo{}, err
		}
	}
	s.mu.Lock()
	t, ok := s.tensors[uri]
	if s.heads == nil {
		s.heads = map[string]int{}
	}
	s.heads[uri]++
	s.mu.Unlock()
	if !ok {
		return TensorInfo{}, fmt.Errorf("head %s: %w", uri, storage.ErrNotFound)
	}
	return TensorInfo{URI: uri, DType: t.dtype, Shape: t.shape, Size: int64(len(t.data)), Handle: uri}, nil
}

func (s *memStore) Fetch(ctx context.Context, t TensorInfo, dst []byte) error {
	s.mu.Lock()
	m := s.tensors[t.Handle.(string)]
	s.mu.Unlock()
	if len(m.data) != len(dst) {
		return fmt.Errorf("fetch %s: %w", t.URI, storage.ErrShortRead)
	}
	copy(dst, m.data)
	return nil
}

func (s *memStore) Write(ctx context.Context, uri string, outs []OutTensor, meta map[string]string) (map[string]string, int64, error) {
	sums := map[string]string{}
	var n int64
	cp := make([]OutTensor, len(outs))
	for i, o := range outs {
		h := sha256.Sum256(o.Data)
		if o.SHA256 != nil {
			// The batcher's digest (hashOutputs) must be the data's.
			if *o.SHA256 != h {
				return nil, 0, fmt.Errorf("write %s: the batcher's sha256 of %s is not its data's", uri, o.Name)
			}
			s.presummed.Add(1)
		}
		sums[o.Name] = hex.EncodeToString(h[:])
		n += int64(len(o.Data))
		cp[i] = o
		cp[i].Data = slices.Clone(o.Data)
	}
	s.mu.Lock()
	s.outs[uri] = cp
	s.writes[uri]++
	s.mu.Unlock()
	return sums, n, nil
}

func (s *memStore) Ping(ctx context.Context) error { return nil }

func (s *memStore) output(uri, name string) []float32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.outs[uri] {
		if o.Name == name {
			v := make([]float32, len(o.Data)/4)
			for i := range v {
				v[i] = math.Float32frombits(binary.LittleEndian.Uint32(o.Data[4*i:]))
			}
			return v
		}
	}
	return nil
}
