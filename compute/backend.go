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
