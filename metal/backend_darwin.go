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
	device    metal.DeviceObject
	queue     metal.CommandQueueObject
	library   metal.LibraryObject
	pipelines map[compute.Kernel]metal.ComputePipelineStateObject // filled by Open, read-only after
	name      string

	mu     sync.Mutex
	pool   map[uint][]metal.BufferObject // released buffers by length
	live   int                           // buffers handed out and not released
	closed bool
}

var _ compute.Backend = (*Backend)(nil)

// Open returns the Metal backend of the system's GPU: it creates the device
// and one command queue and compiles shaders.MetalSource into one pipeline
// per kernel. Errors wrap compute.ErrUnsupported (no device, or the source
// does not compile).
func Open() (compute.Backend, error) {
	var b *Backend
	var err error
	objc.WithAutoreleasePool(func() { b, err = open() })
	if err != nil {
		return nil, err
	}
	return b, nil
}

func open() (*Backend, error) {
	dev := systemDevice()
	if dev.IsNil() {
		return nil, fmt.Errorf("metal: no Metal device (MTLCreateSystemDefaultDevice and MTLCopyAllDevices found none): %w", compute.ErrUnsupported)
	}
	b := &Backend{device: dev, name: dev.Name(), pipelines: map[compute.Kernel]metal.ComputePipelineStateObject{}, pool: map[uint][]metal.BufferObject{}}
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
		return nil, fmt.Errorf("metal: compiling %s: %s: %w", shaders.MetalFile, nsErrorText(nserr), compute.ErrUnsupported)
	}
	for _, k := range compute.Kernels {
		fn := b.library.NewFunctionWithName(string(k))
		if fn.IsNil() {
			return nil, fmt.Errorf("metal: %s has no kernel %s: %w", shaders.MetalFile, k, compute.ErrUnsupported)
		}
		nserr = nil
		// Not dev.NewComputePipelineStateWithFunctionError: it passes fn
		// through objc.WrapAsProtocol, which panics.
		pso := objc.Call[metal.ComputePipelineStateObject](dev, objc.Sel("newComputePipelineStateWithFunction:error:"), fn, unsafe.Pointer(&nserr))
		fn.Release()
		if pso.IsNil() {
			return nil, fmt.Errorf("metal: pipeline %s: %s: %w", k, nsErrorText(nserr), compute.ErrUnsupported)
		}
		b.pipelines[k] = pso
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

// DeviceName is the GPU's name, e.g. "Apple M2 Pro".
func (b *Backend) DeviceName() string { return b.name }

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
	// Metal has no zero-length buffers; pool buckets are 16 KiB pages (the
	// Apple-silicon page size), so near sizes share buffers.
	length := uint(max(nbytes, 1)+pageSize-1) / pageSize * pageSize

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("metal: alloc after Close: %w", compute.ErrUnsupported)
	}
	var mb metal.BufferObject
	if l := b.pool[length]; len(l) > 0 {
		mb = l[len(l)-1]
		b.pool[length] = l[:len(l)-1]
	} else {
		mb = b.device.NewBufferWithLengthOptions(length, metal.ResourceStorageModeShared)
		if mb.IsNil() {
			return nil, fmt.Errorf("metal: newBufferWithLength %d failed (out of GPU memory?): %w", length, compute.ErrDevice)
		}
	}
	b.live++
	return newBuffer(b, mb, dtype, shape, n, nbytes), nil
}

const pageSize = 16 << 10

// put returns a released buffer's Metal buffer to the pool.
func (b *Backend) put(mb metal.BufferObject) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.live--
	if b.closed {
		mb.Release()
		return
	}
	b.pool[mb.Length()] = append(b.pool[mb.Length()], mb)
}

// Close releases the pool, the pipelines, the library, the queue and the
// device. Buffers still held are released when they are.
func (b *Backend) Close() error {
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
	b.pool = nil
	for _, p := range b.pipelines {
		p.Release()
	}
	b.pipelines = nil
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
