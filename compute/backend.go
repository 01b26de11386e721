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
	// RMSInv [eps, dim], DX [dim, eps], DW [dim, rows].
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

// Eps returns the epsilon of an RMSInv or DX op (0 for others).
func (o *Op) Eps() float32 {
	switch o.Kind {
	case OpRMSInv:
		return o.Params[0]
	case OpDX:
		return o.Params[1]
	}
	return 0
}

// DXDim1 is dx of a row of dim 1 in the form every backend uses there.
// With D = 1 the general form r*(dy*w - x*(dy*x*w)*r^2) is
// r*dy*w*(1 - x^2*r^2), and 1 - x^2*r^2 cancels in float32 when x^2 >> eps
// (a 1x1 job with eps 1e-6 came out 6e-5 off relative to float64).
// Since r^2 = 1/(x^2+eps), 1 - x^2*r^2 = eps*r^2 exactly, so
// dx = ((dy*w) * ((eps*r)*r)) * r: every step a product, no cancellation,
// a few roundings of relative error. The shaders spell out the same
// operations in the same order.
func DXDim1(dy, w, r, eps float32) float32 {
	t := dy * w
	k := float32(eps*r) * r
	return float32(t*k) * r
}

// Timing is what a commit reports.
type Timing struct {
	// Device is the time the device spent on the command buffer (GPU start
	// to end for Metal, event-timed for CUDA, wall time for CPU).
	Device time.Duration
}
