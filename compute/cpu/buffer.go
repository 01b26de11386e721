package cpu

import (
	"math/bits"
	"slices"
	"sync"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
)

// buffer is host memory owned by a Backend's pool.
type buffer struct {
	be       *Backend
	dtype    compute.DType
	shape    []int
	n        int
	words    []float32 // backing store, len = size class, 4-byte aligned (nil when adopted and not F32)
	bytes    []byte
	released bool
	// adopted is set for a buffer over memory the backend did not allocate
	// (Adopt): Release calls it instead of pooling words.
	adopted func()
}

func (b *buffer) DType() compute.DType { return b.dtype }
func (b *buffer) Shape() []int         { return slices.Clone(b.shape) }
func (b *buffer) Len() int             { return b.n }
func (b *buffer) Bytes() []byte        { return b.bytes }

func (b *buffer) Float32s() []float32 {
	if b.dtype != compute.F32 {
		return nil
	}
	return b.words[:b.n:b.n]
}

// halfs is the host view of a BF16 or F16 buffer as its elements' bits.
func (b *buffer) halfs() []uint16 {
	if b.n == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b.bytes[0])), b.n)
}

// Release returns the backing store to the pool; a second Release is a
// no-op rather than a double free into the pool.
func (b *buffer) Release() {
	if b.released {
		return
	}
	b.released = true
	if b.adopted != nil {
		b.adopted()
	} else {
		b.be.pool.put(b.words)
	}
	b.words, b.bytes, b.adopted = nil, nil, nil
}

// sizeClass rounds n words up so that at most 1/8 is wasted: eight classes
// per power of two keep the pool's hit rate high for jobs of similar shapes.
func sizeClass(n int) int {
	if n <= 64 {
		return 64
	}
	step := 1 << (bits.Len(uint(n-1)) - 3)
	return (n + step - 1) &^ (step - 1)
}

// pool keeps released backing stores by size class.
type pool struct {
	mu   sync.Mutex
	free map[int][][]float32
	// retained is the total words held; beyond maxRetained, released
	// stores go to the garbage collector instead.
	retained int
	// out is the words handed out and not yet put back; when limit > 0 a
	// released store is kept only while retained+out stays within it.
	out, limit int
}

// maxRetained bounds pooled memory (4 GiB of f32).
const maxRetained = 1 << 30

func (p *pool) get(words int) []float32 {
	c := sizeClass(words)
	p.mu.Lock()
	p.out += c
	if l := p.free[c]; len(l) > 0 {
		w := l[len(l)-1]
		l[len(l)-1] = nil
		p.free[c] = l[:len(l)-1]
		p.retained -= c
		p.mu.Unlock()
		return w
	}
	p.mu.Unlock()
	return make([]float32, c)
}

func (p *pool) put(w []float32) {
	if w == nil {
		return
	}
	c := len(w)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out = max(p.out-c, 0)
	if p.retained+c > maxRetained || (p.limit > 0 && p.retained+c+p.out > p.limit) {
		return
	}
	if p.free == nil {
		p.free = make(map[int][][]float32)
	}
	p.free[c] = append(p.free[c], w)
	p.retained += c
}

func newBuffer(be *Backend, dtype compute.DType, shape []int, n int) *buffer {
	words := (n*dtype.Size() + 3) / 4
	w := be.pool.get(words)
	b := &buffer{be: be, dtype: dtype, shape: slices.Clone(shape), n: n, words: w}
	if len(w) > 0 {
		b.bytes = unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n*dtype.Size())
	} else {
		b.bytes = []byte{}
	}
	return b
}

// Adopt implements compute.HostAdopter: the buffer is b itself, for the
// tensors the worker reads (small inputs arrive inside the storage layer's
// header read), of any dtype of compute.DTypes. b must hold exactly the
// shape's bytes and be aligned to the element size; the kernels only read
// inputs, so the memory is never written.
func (be *Backend) Adopt(dtype compute.DType, shape []int, b []byte, release func()) (compute.Buffer, bool) {
	n := compute.NumElements(shape)
	size := dtype.Size()
	if size == 0 || release == nil || n <= 0 || n > compute.MaxElements || len(b) != size*n ||
		uintptr(unsafe.Pointer(&b[0]))%uintptr(size) != 0 {
		return nil, false
	}
	buf := &buffer{be: be, dtype: dtype, shape: slices.Clone(shape), n: n, bytes: b, adopted: release}
	if dtype == compute.F32 {
		buf.words = unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
	}
	return buf, true
}
