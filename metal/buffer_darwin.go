//go:build cgo

package metal

import (
	"slices"
	"sync"
	"unsafe"

	"github.com/progrium/darwinkit/macos/metal"

	"github.com/rmsgrad/rmsgrad/compute"
)

// buffer is a shared-storage MTLBuffer; its host view is the GPU's memory.
type buffer struct {
	b     *Backend
	mtl   metal.BufferObject
	dtype compute.DType
	shape []int
	n     int
	bytes []byte
	once  sync.Once
}

func newBuffer(b *Backend, mb metal.BufferObject, dtype compute.DType, shape []int, n, nbytes int) *buffer {
	// Contents is the CPU address of the shared (unified) memory: no copy.
	p := mb.Contents()
	return &buffer{b: b, mtl: mb, dtype: dtype, shape: slices.Clone(shape), n: n, bytes: unsafe.Slice((*byte)(p), nbytes)}
}

func (m *buffer) DType() compute.DType { return m.dtype }
func (m *buffer) Shape() []int         { return slices.Clone(m.shape) }
func (m *buffer) Len() int             { return m.n }
func (m *buffer) Bytes() []byte        { return m.bytes }

func (m *buffer) Float32s() []float32 {
	if m.dtype != compute.F32 || len(m.bytes) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&m.bytes[0])), m.n)
}

// Release returns the buffer to the pool; a second Release does nothing.
func (m *buffer) Release() {
	m.once.Do(func() {
		m.bytes = nil
		m.b.put(m.mtl)
	})
}
