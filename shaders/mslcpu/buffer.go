package mslcpu

import (
	"slices"
	"sync"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
)

// buffer is host memory; Execute streams it to the driver and back.
type buffer struct {
	b     *Backend
	dtype compute.DType
	shape []int
	n     int
	words []float32 // backing store, 4-byte aligned
	bytes []byte
}

func (b *buffer) DType() compute.DType { return b.dtype }
func (b *buffer) Shape() []int         { return slices.Clone(b.shape) }
func (b *buffer) Len() int             { return b.n }
func (b *buffer) Bytes() []byte        { return b.bytes }

func (b *buffer) Float32s() []float32 {
	if b.dtype != compute.F32 {
		return nil
	}
	return b.words[:b.n]
}

func (b *buffer) Release() { b.b.pool.put(b) }

// pool keeps released backing stores by word count for reuse.
type pool struct {
	mu   sync.Mutex
	free map[int][][]float32
}

func (p *pool) get(words int) []float32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.free[words]; len(l) > 0 {
		w := l[len(l)-1]
		p.free[words] = l[:len(l)-1]
		return w
	}
	return make([]float32, words)
}

func (p *pool) put(b *buffer) {
	if b.words == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.free == nil {
		p.free = make(map[int][][]float32)
	}
	p.free[len(b.words)] = append(p.free[len(b.words)], b.words)
	b.words, b.bytes = nil, nil
}

func newBuffer(be *Backend, dtype compute.DType, shape []int, n int) *buffer {
	nbytes := n * dtype.Size()
	words := be.pool.get((nbytes + 3) / 4)
	var bs []byte
	if len(words) > 0 {
		bs = unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), nbytes)
	}
	return &buffer{b: be, dtype: dtype, shape: slices.Clone(shape), n: n, words: words, bytes: bs}
}
