package mslcpu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/shaders"
)

// Name is the backend's name.
const Name = "msl-cpu"

// Options configures Open.
type Options struct {
	// Driver is the executable Build returned.
	Driver string
	// Threads is the number of OS threads the driver spreads threadgroups
	// over; 0 means one per CPU. Outputs do not depend on it.
	Threads int
	// SimdWidth is the SIMD width the driver runs simdgroups with (8, 16,
	// 32 or 64, as a Metal pipeline's threadExecutionWidth can be); 0 means
	// 32, Apple silicon's. Outputs do not depend on it.
	SimdWidth int
	// MaxThreads is the device's threadgroup cap for the plan
	// (shaders.MetalDevice); 0 means shaders.MetalMaxThreads.
	MaxThreads int
	// MaxCommandBytes bounds the traffic of one command buffer of the plan
	// (shaders.MetalDevice); 0 means the default.
	MaxCommandBytes int64
	// NoFuse runs RMSInv, DX and DW as separate dispatches even where the
	// plan would fuse them (tests compare the bits).
	NoFuse bool
}

// Backend is the msl-cpu compute.Backend.
type Backend struct {
	opts Options
	dev  shaders.MetalDevice
	pool pool
}

var _ compute.Backend = (*Backend)(nil)

// Open returns a backend that runs dispatches with the driver built by Build.
func Open(opts Options) (*Backend, error) {
	if _, err := os.Stat(opts.Driver); err != nil {
		return nil, fmt.Errorf("mslcpu: driver: %w: %w", err, compute.ErrUnsupported)
	}
	if opts.SimdWidth == 0 {
		opts.SimdWidth = 32
	}
	maxThreads := opts.MaxThreads
	if maxThreads == 0 {
		maxThreads = shaders.MetalMaxThreads
	}
	dev, err := shaders.CheckMetalDevice(Name, opts.SimdWidth, maxThreads)
	if err != nil {
		return nil, err
	}
	dev.MaxCommandBytes, dev.NoFuse = opts.MaxCommandBytes, opts.NoFuse
	return &Backend{opts: opts, dev: dev}, nil
}

// Name returns "msl-cpu".
func (b *Backend) Name() string { return Name }

// DeviceName describes where the shader runs.
func (b *Backend) DeviceName() string {
	t := "all CPUs"
	if b.opts.Threads > 0 {
		t = strconv.Itoa(b.opts.Threads) + " threads"
	}
	return fmt.Sprintf("%s as C++ on %s, SIMD width %d", shaders.MetalFile, t, b.dev.SimdWidth)
}

// Alloc returns a buffer of the given dtype and shape, reusing a released one
// of the same size when it can.
func (b *Backend) Alloc(dtype compute.DType, shape ...int) (compute.Buffer, error) {
	if dtype.Size() == 0 {
		return nil, fmt.Errorf("mslcpu: alloc: dtype %q: %w", dtype, compute.ErrInvalidArgument)
	}
	n := compute.NumElements(shape)
	if n < 0 || n > compute.MaxElements {
		return nil, fmt.Errorf("mslcpu: alloc: shape %v: %w", shape, compute.ErrInvalidArgument)
	}
	return newBuffer(b, dtype, shape, n), nil
}

// Close releases nothing: buffers are Go memory.
func (b *Backend) Close() error { return nil }

// Execute plans the ops with shaders.PlanMetal, as the Metal backend does,
// sends the buffers and the dispatches to the driver, and copies the
// written buffers back. A command-buffer boundary of the plan runs as a
// barrier (the driver runs everything in order). The device time is the
// driver's wall time.
func (b *Backend) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	plan, err := shaders.PlanMetal(ops, b.dev)
	if err != nil {
		return 0, err
	}
	ids := map[*buffer]uint32{}
	var bufs []*buffer
	// Buffer 0 is the placeholder (0 bytes: its data starts at a guard
	// page), then the plan's scratch buffers.
	placeholder := &buffer{b: b}
	bufs = append(bufs, placeholder)
	var scratch []uint32
	for _, n := range plan.Scratch {
		sb := newBuffer(b, compute.F32, []int{n / 4}, n/4)
		defer sb.Release()
		// Scratch starts undefined on a GPU: NaN here, so a kernel that
		// reads a partial before writing it is caught.
		for i := range sb.words {
			sb.words[i] = float32(math.NaN())
		}
		scratch = append(scratch, uint32(len(bufs)))
		bufs = append(bufs, sb)
	}
	var outs []*buffer
	isOut := map[*buffer]bool{}
	id := func(cb compute.Buffer) (uint32, error) {
		mb, ok := cb.(*buffer)
		if !ok || mb.b != b || mb.words == nil && mb.n > 0 {
			return 0, fmt.Errorf("mslcpu: buffer %T is not a live msl-cpu buffer of this backend: %w", cb, compute.ErrInvalidArgument)
		}
		if i, ok := ids[mb]; ok {
			return i, nil
		}
		ids[mb] = uint32(len(bufs))
		bufs = append(bufs, mb)
		return ids[mb], nil
	}
	for i := range ops {
		for _, w := range []compute.Buffer{ops[i].R, ops[i].DX, ops[i].DW} {
			if mb, ok := w.(*buffer); ok && w != nil && !isOut[mb] {
				isOut[mb] = true
				outs = append(outs, mb)
			}
		}
	}
	var req bytes.Buffer // op list; buffers are streamed separately
	le := binary.LittleEndian
	u32 := func(w *bytes.Buffer, v uint32) { _ = binary.Write(w, le, v) }
	u32(&req, uint32(len(plan.Steps)))
	for _, st := range plan.Steps {
		if st.Kind != shaders.StepDispatch {
			u32(&req, 0)
			for range 6 {
				u32(&req, 1)
			}
			u32(&req, 0)
			u32(&req, 0)
			continue
		}
		d := &st.Dispatch
		u32(&req, uint32(len(d.Kernel)))
		req.WriteString(d.Kernel)
		for _, v := range d.Threadgroups {
			u32(&req, uint32(v))
		}
		for _, v := range d.Threads {
			u32(&req, uint32(v))
		}
		u32(&req, uint32(len(d.ThreadgroupMemory)))
		for _, v := range d.ThreadgroupMemory {
			u32(&req, uint32(v))
		}
		u32(&req, uint32(len(d.Bindings)))
		for _, bd := range d.Bindings {
			u32(&req, uint32(bd.Index))
			switch bd.Kind {
			case shaders.BindBytes:
				u32(&req, 1)
				u32(&req, uint32(len(bd.Bytes)))
				req.Write(bd.Bytes)
				continue
			case shaders.BindNone:
				u32(&req, 0)
				u32(&req, 0)
				continue
			case shaders.BindScratch:
				u32(&req, 0)
				u32(&req, scratch[bd.Scratch])
				continue
			}
			n, err := id(bd.Buffer)
			if err != nil {
				return 0, fmt.Errorf("%s %s: %w", d.Kernel, bd.Name, err)
			}
			u32(&req, 0)
			u32(&req, n)
		}
	}

	cmd := exec.CommandContext(ctx, b.opts.Driver)
	if b.opts.Threads > 0 {
		cmd.Env = append(os.Environ(), "MSLCPU_THREADS="+strconv.Itoa(b.opts.Threads))
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, fmt.Errorf("mslcpu: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, fmt.Errorf("mslcpu: %w", err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("mslcpu: start driver: %w: %w", err, compute.ErrDevice)
	}
	werr := make(chan error, 1)
	go func() {
		w := bufio.NewWriterSize(stdin, 1<<20)
		_, _ = w.WriteString("MSLC")
		hdr := new(bytes.Buffer)
		u32(hdr, 2)
		u32(hdr, uint32(b.dev.SimdWidth))
		u32(hdr, uint32(len(bufs)))
		_, _ = w.Write(hdr.Bytes())
		for _, mb := range bufs {
			var n [8]byte
			le.PutUint64(n[:], uint64(len(mb.bytes)))
			_, _ = w.Write(n[:])
			_, _ = w.Write(mb.bytes)
		}
		_, _ = w.Write(req.Bytes())
		tail := new(bytes.Buffer)
		u32(tail, uint32(len(outs)))
		for _, mb := range outs {
			u32(tail, ids[mb])
		}
		_, _ = w.Write(tail.Bytes())
		err := w.Flush()
		werr <- errors.Join(err, stdin.Close())
	}()
	var rerr error
	for _, mb := range outs {
		if _, err := io.ReadFull(stdout, mb.bytes); err != nil {
			rerr = err
			break
		}
	}
	wErr := <-werr
	waitErr := cmd.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return elapsed, fmt.Errorf("mslcpu: %w", err)
	}
	if waitErr != nil || rerr != nil || wErr != nil {
		return elapsed, fmt.Errorf("mslcpu: driver failed: %w: %s: %w", errors.Join(waitErr, rerr, wErr),
			strings.TrimSpace(stderr.String()), compute.ErrDevice)
	}
	return elapsed, nil
}
