package mslcpu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
}

// Backend is the msl-cpu compute.Backend.
type Backend struct {
	opts Options
	pool pool
}

var _ compute.Backend = (*Backend)(nil)

// Open returns a backend that runs dispatches with the driver built by Build.
func Open(opts Options) (*Backend, error) {
	if _, err := os.Stat(opts.Driver); err != nil {
		return nil, fmt.Errorf("mslcpu: driver: %w: %w", err, compute.ErrUnsupported)
	}
	return &Backend{opts: opts}, nil
}

// Name returns "msl-cpu".
func (b *Backend) Name() string { return Name }

// DeviceName describes where the shader runs.
func (b *Backend) DeviceName() string {
	t := "all CPUs"
	if b.opts.Threads > 0 {
		t = strconv.Itoa(b.opts.Threads) + " threads"
	}
	return shaders.MetalFile + " as C++ on " + t
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

// Execute plans every op with shaders.MetalPlan, sends the buffers and the
// dispatches to the driver, and copies the written buffers back. The device
// time is the driver's wall time.
func (b *Backend) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	ids := map[*buffer]uint32{}
	var bufs []*buffer
	var outs []*buffer
	isOut := map[*buffer]bool{}
	id := func(cb compute.Buffer) (uint32, error) {
		mb, ok := cb.(*buffer)
		if !ok || mb.b != b || mb.words == nil {
			return 0, fmt.Errorf("mslcpu: buffer %T is not a live msl-cpu buffer of this backend: %w", cb, compute.ErrInvalidArgument)
		}
		if i, ok := ids[mb]; ok {
			return i, nil
		}
		ids[mb] = uint32(len(bufs))
		bufs = append(bufs, mb)
		return ids[mb], nil
	}
	var req bytes.Buffer // op list; buffers are streamed separately
	le := binary.LittleEndian
	u32 := func(w *bytes.Buffer, v uint32) { _ = binary.Write(w, le, v) }
	u32(&req, uint32(len(ops)))
	for i := range ops {
		op := &ops[i]
		if op.Kind == compute.OpBarrier {
			u32(&req, 0)
			for range 6 {
				u32(&req, 1)
			}
			u32(&req, 0)
			u32(&req, 0)
			continue
		}
		d, err := shaders.MetalPlan(op)
		if err != nil {
			return 0, err
		}
		u32(&req, uint32(len(d.Kernel)))
		req.WriteString(string(d.Kernel))
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
			if bd.Buffer == nil {
				u32(&req, 1)
				u32(&req, uint32(len(bd.Bytes)))
				req.Write(bd.Bytes)
				continue
			}
			n, err := id(bd.Buffer)
			if err != nil {
				return 0, fmt.Errorf("%s %s: %w", d.Kernel, bd.Name, err)
			}
			u32(&req, 0)
			u32(&req, n)
		}
		for _, w := range []compute.Buffer{op.R, op.DX, op.DW} {
			if mb, ok := w.(*buffer); ok && w != nil && !isOut[mb] {
				isOut[mb] = true
				outs = append(outs, mb)
			}
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
		u32(hdr, 1)
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
