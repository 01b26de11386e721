package metal

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/progrium/darwinkit/macos/metal"
	"github.com/progrium/darwinkit/objc"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/shaders"
)

// Execute encodes ops into one command buffer with one concurrent compute
// encoder, commits it and waits. It returns the GPU time (GPUEndTime -
// GPUStartTime). A committed command buffer cannot be cancelled: ctx is
// checked before encoding and before the commit only.
func (b *Backend) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	// Plan (and check) everything before anything is encoded.
	plans := make([]shaders.Dispatch, len(ops))
	for i := range ops {
		if ops[i].Kind == compute.OpBarrier {
			continue
		}
		d, err := shaders.MetalPlan(&ops[i])
		if err != nil {
			return 0, err
		}
		pso, ok := b.pipelines[d.Kernel]
		if !ok {
			return 0, fmt.Errorf("metal: no pipeline for %s: %w", d.Kernel, compute.ErrUnsupported)
		}
		if max := pso.MaxTotalThreadsPerThreadgroup(); uint(d.TotalThreads()) > max {
			return 0, fmt.Errorf("metal: %s: %d threads per threadgroup, pipeline allows %d: %w", d.Kernel, d.TotalThreads(), max, compute.ErrUnsupported)
		}
		for _, bd := range d.Bindings {
			if bd.Buffer == nil {
				continue
			}
			mb, ok := bd.Buffer.(*buffer)
			if !ok || mb.b != b || mb.bytes == nil && mb.n > 0 {
				return 0, fmt.Errorf("metal: %s %s: %T is not a live buffer of this backend: %w", d.Kernel, bd.Name, bd.Buffer, compute.ErrInvalidArgument)
			}
		}
		plans[i] = d
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var gpu time.Duration
	var err error
	// The command buffer and encoder are autoreleased objects.
	objc.WithAutoreleasePool(func() { gpu, err = b.run(ctx, ops, plans) })
	return gpu, err
}

func (b *Backend) run(ctx context.Context, ops []compute.Op, plans []shaders.Dispatch) (time.Duration, error) {
	cb := b.queue.CommandBuffer()
	if cb.IsNil() {
		return 0, fmt.Errorf("metal: commandBuffer returned nil: %w", compute.ErrDevice)
	}
	enc := cb.ComputeCommandEncoderWithDispatchType(metal.DispatchTypeConcurrent)
	if enc.IsNil() {
		return 0, fmt.Errorf("metal: computeCommandEncoderWithDispatchType returned nil: %w", compute.ErrDevice)
	}
	for i := range ops {
		if ops[i].Kind == compute.OpBarrier {
			// Everything before completes and is visible to everything
			// after: r written by rms_inv is read by dx and dw.
			enc.MemoryBarrierWithScope(metal.BarrierScopeBuffers)
			continue
		}
		d := &plans[i]
		objc.Call[objc.Void](enc, objc.Sel("setComputePipelineState:"), b.pipelines[d.Kernel])
		for _, bd := range d.Bindings {
			if bd.Buffer == nil {
				// setBytes copies the bytes while encoding.
				enc.SetBytesLengthAtIndex(unsafe.Pointer(&bd.Bytes[0]), uint(len(bd.Bytes)), uint(bd.Index))
				continue
			}
			mb := bd.Buffer.(*buffer)
			objc.Call[objc.Void](enc, objc.Sel("setBuffer:offset:atIndex:"), mb.mtl, uint(0), uint(bd.Index))
		}
		for idx, n := range d.ThreadgroupMemory {
			enc.SetThreadgroupMemoryLengthAtIndex(uint(shaders.RoundThreadgroupMemory(n)), uint(idx))
		}
		enc.DispatchThreadgroupsThreadsPerThreadgroup(
			metal.Size{Width: uint64(d.Threadgroups[0]), Height: uint64(d.Threadgroups[1]), Depth: uint64(d.Threadgroups[2])},
			metal.Size{Width: uint64(d.Threads[0]), Height: uint64(d.Threads[1]), Depth: uint64(d.Threads[2])})
	}
	// ComputeCommandEncoderObject has no EndEncoding in darwinkit v0.5.0.
	metal.CommandEncoderObject{Object: enc.Object}.EndEncoding()
	if err := ctx.Err(); err != nil {
		// Encoded but not committed: the command buffer is dropped with the
		// autorelease pool.
		return 0, err
	}
	cb.Commit()
	cb.WaitUntilCompleted()
	if st := cb.Status(); st != metal.CommandBufferStatusCompleted {
		msg := "no error object"
		if e := cb.Error(); !e.IsNil() {
			msg = e.LocalizedDescription()
		}
		return 0, fmt.Errorf("metal: command buffer ended with status %d: %s: %w", st, msg, compute.ErrDevice)
	}
	return time.Duration(float64(cb.GPUEndTime()-cb.GPUStartTime()) * float64(time.Second)), nil
}
