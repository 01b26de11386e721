//go:build cgo

package metal

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/progrium/darwinkit/macos/foundation"
	"github.com/progrium/darwinkit/macos/metal"
	"github.com/progrium/darwinkit/objc"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/shaders"
)

// Backend is the Metal compute.Backend. It is safe for concurrent use.
type Backend struct {
	device      metal.DeviceObject
	queue       metal.CommandQueueObject
	library     metal.LibraryObject
	pipelines   map[string]metal.ComputePipelineStateObject // filled by Open, read-only after
	placeholder metal.BufferObject                          // bound where a kernel's flags leave an argument unused
	dev         shaders.MetalDevice
	name        string

	// life is held shared by every Execute and exclusively by Close, so
	// Close waits for running command buffers before it releases what
	// they use.
	life sync.RWMutex

	mu     sync.Mutex
	pool   map[uint][]metal.BufferObject // released buffers by length
	pooled int64                         // bytes in pool
	live   int64                         // bytes handed out and not released
	limit  int64                         // PoolLimit; 0: unbounded
	closed bool
}

var _ compute.Backend = (*Backend)(nil)

// Open returns the Metal backend of the system's GPU: it creates the device
// and one command queue, compiles shaders.MetalSource into one pipeline per
// kernel function, and checks that the pipelines suit the kernels (SIMD
// width a power of two from 8 to 64, at least 64 threads per threadgroup
// for the rows kernel and 256 for the reduce). Errors wrap
// compute.ErrUnsupported and name the GPU: no device, the source does not
// compile, or a GPU the kernels do not support; `backend: auto` then moves
// on to the next backend.
func Open(opts ...Option) (compute.Backend, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	var b *Backend
	var err error
	objc.WithAutoreleasePool(func() { b, err = open(o) })
	if err != nil {
		return nil, err
	}
	return b, nil
}

func open(o options) (*Backend, error) {
	dev := systemDevice()
	if dev.IsNil() {
		return nil, fmt.Errorf("metal: no Metal device (MTLCreateSystemDefaultDevice and MTLCopyAllDevices found none): %w", compute.ErrUnsupported)
	}
	b := &Backend{device: dev, name: dev.Name(), pipelines: map[string]metal.ComputePipelineStateObject{},
		pool: map[uint][]metal.BufferObject{}, limit: o.poolLimit}
	ok := false
	defer func() {
		if !ok {
			b.releaseAll()
		}
	}()
	b.queue = dev.NewCommandQueue()
	if b.queue.IsNil() {
		return nil, fmt.Errorf("metal: %s: newCommandQueue returned nil: %w", b.name, compute.ErrUnsupported)
	}

	opts := metal.NewCompileOptions() // autoreleased
	// The kernels spell out their fma and divisions; fast math would let
	// the compiler reassociate reductions and approximate sqrt and division.
	opts.SetFastMathEnabled(false)
	var nserr unsafe.Pointer
	b.library = dev.NewLibraryWithSourceOptionsError(shaders.MetalSource, opts, unsafe.Pointer(&nserr))
	if b.library.IsNil() {
		return nil, fmt.Errorf("metal: %s: compiling %s: %s: %w", b.name, shaders.MetalFile, nsErrorText(nserr), compute.ErrUnsupported)
	}
	for _, k := range shaders.MetalKernels {
		fn := b.library.NewFunctionWithName(k)
		if fn.IsNil() {
			return nil, fmt.Errorf("metal: %s has no kernel %s: %w", shaders.MetalFile, k, compute.ErrUnsupported)
		}
		nserr = nil
		// Not dev.NewComputePipelineStateWithFunctionError: it passes fn
		// through objc.WrapAsProtocol, which panics.
		pso := objc.Call[metal.ComputePipelineStateObject](dev, objc.Sel("newComputePipelineStateWithFunction:error:"), fn, unsafe.Pointer(&nserr))
		fn.Release()
		if pso.IsNil() {
			return nil, fmt.Errorf("metal: %s: pipeline %s: %s: %w", b.name, k, nsErrorText(nserr), compute.ErrUnsupported)
		}
		b.pipelines[k] = pso
	}
	rows := b.pipelines[shaders.MetalRowsKernel]
	d, err := shaders.CheckMetalDevice(b.name, int(rows.ThreadExecutionWidth()), int(rows.MaxTotalThreadsPerThreadgroup()))
	if err != nil {
		return nil, err
	}
	if n := b.pipelines[shaders.MetalReduceKernel].MaxTotalThreadsPerThreadgroup(); n < shaders.MetalReduceCols*shaders.MetalReduceSlices {
		return nil, fmt.Errorf("metal: %s: the dw reduce needs %d threads per threadgroup, the pipeline allows %d: %w",
			b.name, shaders.MetalReduceCols*shaders.MetalReduceSlices, n, compute.ErrUnsupported)
	}
	d.MaxCommandBytes = o.maxCommandBytes
	b.dev = d
	b.placeholder = dev.NewBufferWithLengthOptions(16, metal.ResourceStorageModeShared)
	if b.placeholder.IsNil() {
		return nil, fmt.Errorf("metal: %s: newBufferWithLength 16 failed: %w", b.name, compute.ErrUnsupported)
	}
	ok = true
	return b, nil
}

// nsErrorText is an NSError's description, or a placeholder for nil.
func nsErrorText(p unsafe.Pointer) string {
	if p == nil {
		return "no error object"
	}
	return foundation.ErrorFrom(p).LocalizedDescription()
}

// Name returns "metal".
func (b *Backend) Name() string { return "metal" }

// PoolStats reports the buffer pool: bytes of the Metal buffers handed out
// and not released, bytes kept for reuse, and the limit (PoolLimit; 0:
// none).
func (b *Backend) PoolStats() (live, pooled, limit int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live, b.pooled, b.limit
}

// DeviceName is the GPU's name with the geometry the kernels run with,
// e.g. "Apple M2 Pro (SIMD width 32, 512 threads)".
func (b *Backend) DeviceName() string {
	return fmt.Sprintf("%s (SIMD width %d, %d threads)", b.name, b.dev.SimdWidth, b.dev.MaxThreads)
}

// Alloc returns a shared-storage buffer of the given dtype and shape, reusing
// a released one of the same length when there is one. A new buffer is
// zeroed; a reused one holds stale data.
func (b *Backend) Alloc(dtype compute.DType, shape ...int) (compute.Buffer, error) {
	if dtype.Size() == 0 {
		return nil, fmt.Errorf("metal: alloc: dtype %q: %w", dtype, compute.ErrInvalidArgument)
	}
	n := compute.NumElements(shape)
	if n < 0 || n > compute.MaxElements {
		return nil, fmt.Errorf("metal: alloc: shape %v: %w", shape, compute.ErrInvalidArgument)
	}
	nbytes := n * dtype.Size()
	mb, err := b.get(nbytes)
	if err != nil {
		return nil, err
	}
	return newBuffer(b, mb, dtype, shape, n, nbytes), nil
}

const pageSize = 16 << 10

// get takes a Metal buffer of at least nbytes from the pool, or makes one.
// Metal has no zero-length buffers; pool buckets are 16 KiB pages (the
// Apple-silicon page size), so near sizes share buffers.
func (b *Backend) get(nbytes int) (metal.BufferObject, error) {
	length := uint(max(nbytes, 1)+pageSize-1) / pageSize * pageSize
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return metal.BufferObject{}, fmt.Errorf("metal: alloc after Close: %w", compute.ErrUnsupported)
	}
	if l := b.pool[length]; len(l) > 0 {
		mb := l[len(l)-1]
		b.pool[length] = l[:len(l)-1]
		b.pooled -= int64(length)
		b.live += int64(length)
		return mb, nil
	}
	// A new buffer: first make room under the limit by releasing pooled
	// buffers of other lengths.
	if b.limit > 0 {
		for l, bufs := range b.pool {
			for len(bufs) > 0 && b.live+b.pooled+int64(length) > b.limit {
				bufs[len(bufs)-1].Release()
				bufs = bufs[:len(bufs)-1]
				b.pooled -= int64(l)
			}
			b.pool[l] = bufs
		}
	}
	mb := b.device.NewBufferWithLengthOptions(length, metal.ResourceStorageModeShared)
	if mb.IsNil() {
		return metal.BufferObject{}, fmt.Errorf("metal: %s: newBufferWithLength %d failed (out of GPU memory?): %w", b.name, length, compute.ErrDevice)
	}
	b.live += int64(length)
	return mb, nil
}

// put returns a released buffer's Metal buffer to the pool, or to the
// system when the pool is closed or keeping it would pass the limit.
func (b *Backend) put(mb metal.BufferObject) {
	length := int64(mb.Length())
	b.mu.Lock()
	defer b.mu.Unlock()
	b.live -= length
	if b.closed || b.limit > 0 && b.live+b.pooled+length > b.limit {
		mb.Release()
		return
	}
	b.pool[uint(length)] = append(b.pool[uint(length)], mb)
	b.pooled += length
}

// Close waits for running Executes, then releases the pool, the
// pipelines, the library, the queue and the device. Buffers still held
// are released when they are; Alloc and Execute fail after Close.
func (b *Backend) Close() error {
	b.life.Lock()
	defer b.life.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	b.releaseAll()
	return nil
}

// releaseAll sends release to every object a new* or copy call created.
func (b *Backend) releaseAll() {
	for _, l := range b.pool {
		for _, mb := range l {
			mb.Release()
		}
	}
	b.pool, b.pooled = nil, 0
	for _, p := range b.pipelines {
		p.Release()
	}
	b.pipelines = nil
	if !b.placeholder.IsNil() {
		b.placeholder.Release()
	}
	if !b.library.IsNil() {
		b.library.Release()
	}
	if !b.queue.IsNil() {
		b.queue.Release()
	}
	if !b.device.IsNil() {
		b.device.Release()
	}
}
