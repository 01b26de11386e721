package compute

import (
	"context"
	"time"
)

// Backend runs recorded command buffers on one device.
type Backend interface {
	// Name is the backend's short name: "cpu", "metal", "cuda", "msl-cpu".
	Name() string
	// DeviceName describes the device, e.g. "Apple M2 Pro" or "cpu x2".
	DeviceName() string
	// Alloc returns a zeroed or reused buffer of the given dtype and shape
	// from the backend's pool. Contents of a reused buffer are unspecified.
	Alloc(dtype DType, shape ...int) (Buffer, error)
	// Execute runs ops in order: ops between two OpBarrier entries may run
	// concurrently; everything before a barrier completes before anything
	// after it starts. It returns the device time spent. The ops have been
	// validated by CommandBuffer.
	Execute(ctx context.Context, ops []Op) (time.Duration, error)
	// Close releases the device. Buffers must be released first.
	Close() error
}

// HostAdopter is a Backend that can compute on host memory it did not
// allocate, so that input bytes already in memory (a small tensor that the
// storage layer's header read holds) become a buffer without a copy. The
// cpu backend implements it; device backends, whose buffers live in their
// own memory, do not.
type HostAdopter interface {
	// Adopt returns a buffer of dtype and shape over b, which must be
	// exactly the shape's bytes and stay untouched until the buffer is
	// released; Release then calls release (once) instead of pooling the
	// memory. ok is false when b is unsuitable (a size or alignment the
	// backend cannot use); the caller then allocates and copies.
	Adopt(dtype DType, shape []int, b []byte, release func()) (buf Buffer, ok bool)
}

// OpKind says what an Op is.
type OpKind uint8

// Op kinds.
const (
	OpRMSInv OpKind = iota + 1
	OpDX
	OpDW
	OpBarrier
)

// Op is one recorded, validated step of a command buffer. Unused fields are
// nil. Rows and Dim are the 2-D view of the tensors (leading dims folded).
type Op struct {
	Kind OpKind
	// Buffers. RMSInv: X -> R. DX: X, W, DY, R -> DX. DW: X, DY, R -> DW.
	X, W, DY, R, DX, DW Buffer
	Rows, Dim           int
	// Params as in the Metal kernels' float2 parameter buffer:
	// RMSInv [eps, dim], DX [dim, 0], DW [dim, rows].
	Params [2]float32
}

// Kernel returns the kernel an op dispatches, or "" for a barrier.
func (o *Op) Kernel() Kernel {
	switch o.Kind {
	case OpRMSInv:
		return KernelRMSInv
	case OpDX:
		return KernelDX
	case OpDW:
		return KernelDW
	}
	return ""
}

// Eps returns the epsilon of an RMSInv op.
func (o *Op) Eps() float32 { return o.Params[0] }

// Timing is what a commit reports.
type Timing struct {
	// Device is the time the device spent on the command buffer (GPU start
	// to end for Metal, event-timed for CUDA, wall time for CPU).
	Device time.Duration
}
