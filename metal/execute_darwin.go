//go:build cgo

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

// Execute plans ops with shaders.PlanMetal, encodes the plan into command
// buffers with one concurrent compute encoder each (a barrier step is
// memoryBarrierWithScope(buffers)), commits them one after the other and
// waits for each. A plan is one command buffer unless its traffic is over
// the MaxCommandBytes bound. It returns the GPU time (GPUEndTime -
// GPUStartTime, summed). A committed command buffer cannot be cancelled:
// ctx is checked before each command buffer is encoded and committed.
func (b *Backend) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	b.life.RLock()
	defer b.life.RUnlock()
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("metal: Execute after Close: %w", compute.ErrDevice)
	}
	plan, err := shaders.PlanMetal(ops, b.dev)
	if err != nil {
		return 0, err
	}
	// Check everything before anything is encoded.
	for i := range plan.Steps {
		st := &plan.Steps[i]
		if st.Kind != shaders.StepDispatch {
			continue
		}
		pso, ok := b.pipelines[st.Kernel]
		if !ok {
			return 0, fmt.Errorf("metal: no pipeline for %s: %w", st.Kernel, compute.ErrUnsupported)
		}
		if lim := pso.MaxTotalThreadsPerThreadgroup(); uint(st.TotalThreads()) > lim {
			return 0, fmt.Errorf("metal: %s: %s: %d threads per threadgroup, the pipeline allows %d: %w", b.name, st.Kernel, st.TotalThreads(), lim, compute.ErrUnsupported)
		}
		for _, bd := range st.Bindings {
			if bd.Kind != shaders.BindBuffer {
				continue
			}
			mb, ok := bd.Buffer.(*buffer)
			if !ok || mb.b != b || mb.bytes == nil && mb.n > 0 {
				return 0, fmt.Errorf("metal: %s %s: %T is not a live buffer of this backend: %w", st.Kernel, bd.Name, bd.Buffer, compute.ErrInvalidArgument)
			}
		}
	}
	scratch := make([]metal.BufferObject, len(plan.Scratch))
	defer func() {
		for _, mb := range scratch {
			if !mb.IsNil() {
				b.put(mb)
			}
		}
	}()
	for i, n := range plan.Scratch {
		if scratch[i], err = b.get(n); err != nil {
			return 0, err
		}
	}

	var gpu time.Duration
	ncb := plan.Commands()
	for k, start := 0, 0; start < len(plan.Steps) || k == 0; k++ {
		end := start
		for end < len(plan.Steps) && plan.Steps[end].Kind != shaders.StepCommit {
			end++
		}
		if err := ctx.Err(); err != nil {
			return gpu, err
		}
		var d time.Duration
		// The command buffer and encoder are autoreleased objects.
		objc.WithAutoreleasePool(func() { d, err = b.run(ctx, plan.Steps[start:end], scratch) })
		gpu += d
		if err != nil {
			if ncb > 1 {
				err = fmt.Errorf("metal: command buffer %d of %d: %w", k+1, ncb, err)
			}
			return gpu, err
		}
		start = end + 1
	}
	return gpu, nil
}

// run encodes steps (no StepCommit among them) into one command buffer,
// commits it and waits.
func (b *Backend) run(ctx context.Context, steps []shaders.Step, scratch []metal.BufferObject) (time.Duration, error) {
	cb := b.queue.CommandBuffer()
	if cb.IsNil() {
		return 0, fmt.Errorf("metal: commandBuffer returned nil: %w", compute.ErrDevice)
	}
	enc := cb.ComputeCommandEncoderWithDispatchType(metal.DispatchTypeConcurrent)
	if enc.IsNil() {
		return 0, fmt.Errorf("metal: computeCommandEncoderWithDispatchType returned nil: %w", compute.ErrDevice)
	}
	for i := range steps {
		st := &steps[i]
		if st.Kind == shaders.StepBarrier {
			// Everything before completes and is visible to everything
			// after: r and the dw partials are read after they are written.
			enc.MemoryBarrierWithScope(metal.BarrierScopeBuffers)
			continue
		}
		objc.Call[objc.Void](enc, objc.Sel("setComputePipelineState:"), b.pipelines[st.Kernel])
		for _, bd := range st.Bindings {
			var mb metal.BufferObject
			switch bd.Kind {
			case shaders.BindBytes:
				// setBytes copies the bytes while encoding.
				enc.SetBytesLengthAtIndex(unsafe.Pointer(&bd.Bytes[0]), uint(len(bd.Bytes)), uint(bd.Index))
				continue
			case shaders.BindNone:
				mb = b.placeholder
			case shaders.BindScratch:
				mb = scratch[bd.Scratch]
			default:
				mb = bd.Buffer.(*buffer).mtl
			}
			// Not SetBufferOffsetAtIndex: it wraps the buffer with
			// objc.WrapAsProtocol, which panics.
			objc.Call[objc.Void](enc, objc.Sel("setBuffer:offset:atIndex:"), mb, uint(0), uint(bd.Index))
		}
		for idx, n := range st.ThreadgroupMemory {
			enc.SetThreadgroupMemoryLengthAtIndex(uint(shaders.RoundThreadgroupMemory(n)), uint(idx))
		}
		enc.DispatchThreadgroupsThreadsPerThreadgroup(
			metal.Size{Width: uint64(st.Threadgroups[0]), Height: uint64(st.Threadgroups[1]), Depth: uint64(st.Threadgroups[2])},
			metal.Size{Width: uint64(st.Threads[0]), Height: uint64(st.Threads[1]), Depth: uint64(st.Threads[2])})
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
		return 0, commandError(b.name, st, cb)
	}
	return time.Duration(float64(cb.GPUEndTime()-cb.GPUStartTime()) * float64(time.Second)), nil
}

// commandError describes a command buffer that did not complete. A timeout
// (macOS ends command buffers that run too long; the plan's
// MaxCommandBytes bound keeps each far below that) and a page fault get
// messages of their own.
func commandError(gpu string, st metal.CommandBufferStatus, cb metal.CommandBufferObject) error {
	e := cb.Error()
	if e.IsNil() {
		return fmt.Errorf("metal: %s: command buffer ended with status %d and no error object: %w", gpu, st, compute.ErrDevice)
	}
	switch metal.CommandBufferError(e.Code()) {
	case metal.CommandBufferErrorTimeout:
		return fmt.Errorf("metal: %s: the command buffer timed out (macOS ended it; the GPU may be shared with a heavy display or other work, or metal.MaxCommandBytes is set too high): %s: %w",
			gpu, e.LocalizedDescription(), compute.ErrDevice)
	case metal.CommandBufferErrorPageFault:
		return fmt.Errorf("metal: %s: GPU page fault (a kernel read or wrote outside a buffer; please report it with the job's shape): %s: %w",
			gpu, e.LocalizedDescription(), compute.ErrDevice)
	}
	return fmt.Errorf("metal: %s: command buffer ended with status %d, error %d: %s: %w", gpu, st, e.Code(), e.LocalizedDescription(), compute.ErrDevice)
}
