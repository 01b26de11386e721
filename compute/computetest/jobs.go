package computetest

import (
	"context"
	"fmt"

	"github.com/rmsgrad/rmsgrad/compute"
)

// Job is one RMSNorm-backward problem held in host memory.
type Job struct {
	Rows, Dim int
	Eps       float32
	X, W, DY  []float32
}

// NewJob returns a random job, a pure function of its arguments: x uniform
// in [-1, 1), w in [0.9, 1.1), dy in [-0.5, 0.5), eps 1e-5.
func NewJob(seed uint64, rows, dim int) Job {
	n := rows * dim
	w := Uniform(seed*3+2, dim, 0.1)
	for i := range w {
		w[i]++
	}
	return Job{Rows: rows, Dim: dim, Eps: 1e-5,
		X: Uniform(seed*3+1, n, 1), W: w, DY: Uniform(seed*3+3, n, 0.5)}
}

// Output is what a job computes.
type Output struct {
	R, DX, DW []float32
}

// Check compares o with the float64 oracle at Compare's tolerance.
func (j Job) Check(o Output) error {
	r, dx, dw := Oracle(j.X, j.W, j.DY, j.Rows, j.Dim, float64(j.Eps))
	if err := Compare("r", o.R, r, j.Rows, j.Dim); err != nil {
		return err
	}
	if err := CompareDX(o.DX, dx, j.X, j.W, j.DY, j.Rows, j.Dim, float64(j.Eps)); err != nil {
		return err
	}
	return Compare("dw", o.DW, dw, j.Rows, j.Dim)
}

// Order says how RunJobs records a batch.
type Order int

// Recording orders. All of them record every RMSInv, one Barrier, then the
// dx and dw dispatches, as a worker batch does.
const (
	// DXThenDW records job 0's DX, job 0's DW, job 1's DX, ...
	DXThenDW Order = iota
	// AllDXThenAllDW records every DX, then every DW.
	AllDXThenAllDW
	// Reversed records the second phase in reverse job order, DW first.
	Reversed
)

// RunJobs runs jobs on b in ONE command buffer (every RMSInv, a barrier,
// every DX and DW in the given order) and returns their outputs. Buffers
// come from b.Alloc and are released before it returns.
func RunJobs(ctx context.Context, b compute.Backend, jobs []Job, order Order) ([]Output, error) {
	type bufs struct{ x, w, dy, r, dx, dw compute.Buffer }
	all := make([]bufs, len(jobs))
	var allocated []compute.Buffer
	defer func() {
		for _, buf := range allocated {
			buf.Release()
		}
	}()
	alloc := func(src []float32, shape ...int) (compute.Buffer, error) {
		buf, err := b.Alloc(compute.F32, shape...)
		if err != nil {
			return nil, err
		}
		allocated = append(allocated, buf)
		f := buf.Float32s()
		if len(f) != compute.NumElements(shape) {
			return nil, fmt.Errorf("Alloc(F32, %v): Float32s has %d elements", shape, len(f))
		}
		if src != nil {
			copy(f, src)
		} else {
			// Poison outputs so a kernel that skips an element is caught.
			for i := range f {
				f[i] = float32FromBits(0x7fc00bad)
			}
		}
		return buf, nil
	}
	for i, j := range jobs {
		var err error
		bb := &all[i]
		if bb.x, err = alloc(j.X, j.Rows, j.Dim); err != nil {
			return nil, err
		}
		if bb.w, err = alloc(j.W, j.Dim); err != nil {
			return nil, err
		}
		if bb.dy, err = alloc(j.DY, j.Rows, j.Dim); err != nil {
			return nil, err
		}
		if bb.r, err = alloc(nil, j.Rows); err != nil {
			return nil, err
		}
		if bb.dx, err = alloc(nil, j.Rows, j.Dim); err != nil {
			return nil, err
		}
		if bb.dw, err = alloc(nil, j.Dim); err != nil {
			return nil, err
		}
	}
	cb := compute.NewCommandBuffer(b)
	for i, j := range jobs {
		bb := all[i]
		if err := cb.RMSInv(bb.x, bb.r, compute.RMSInvParams(j.Eps, j.Dim), j.Rows, j.Dim); err != nil {
			return nil, err
		}
	}
	cb.Barrier()
	dx := func(i int) error {
		bb, j := all[i], jobs[i]
		return cb.DX(bb.x, bb.w, bb.dy, bb.r, bb.dx, compute.DXParams(j.Dim, j.Eps), j.Rows, j.Dim)
	}
	dw := func(i int) error {
		bb, j := all[i], jobs[i]
		return cb.DW(bb.x, bb.dy, bb.r, bb.dw, compute.DWParams(j.Dim, j.Rows), j.Rows, j.Dim)
	}
	var seq []func() error
	switch order {
	case DXThenDW:
		for i := range jobs {
			seq = append(seq, func() error { return dx(i) }, func() error { return dw(i) })
		}
	case AllDXThenAllDW:
		for i := range jobs {
			seq = append(seq, func() error { return dx(i) })
		}
		for i := range jobs {
			seq = append(seq, func() error { return dw(i) })
		}
	case Reversed:
		for i := len(jobs) - 1; i >= 0; i-- {
			seq = append(seq, func() error { return dw(i) }, func() error { return dx(i) })
		}
	}
	for _, f := range seq {
		if err := f(); err != nil {
			return nil, err
		}
	}
	if _, err := cb.Commit(ctx); err != nil {
		return nil, err
	}
	outs := make([]Output, len(jobs))
	for i := range jobs {
		bb := all[i]
		outs[i] = Output{
			R:  append([]float32(nil), bb.r.Float32s()...),
			DX: append([]float32(nil), bb.dx.Float32s()...),
			DW: append([]float32(nil), bb.dw.Float32s()...),
		}
	}
	return outs, nil
}

// RunJob runs one job in its own command buffer.
func RunJob(ctx context.Context, b compute.Backend, j Job) (Output, error) {
	o, err := RunJobs(ctx, b, []Job{j}, DXThenDW)
	if err != nil {
		return Output{}, err
	}
	return o[0], nil
}

// BitsEqual reports the first element where a and b differ bitwise
// (NaNs included), or "" when they are identical.
func BitsEqual(a, b Output) string {
	for _, p := range []struct {
		name string
		a, b []float32
	}{{"r", a.R, b.R}, {"dx", a.DX, b.DX}, {"dw", a.DW, b.DW}} {
		if len(p.a) != len(p.b) {
			return fmt.Sprintf("%s: length %d vs %d", p.name, len(p.a), len(p.b))
		}
		for i := range p.a {
			if float32Bits(p.a[i]) != float32Bits(p.b[i]) {
				return fmt.Sprintf("%s[%d]: %g (%#08x) vs %g (%#08x)", p.name, i,
					p.a[i], float32Bits(p.a[i]), p.b[i], float32Bits(p.b[i]))
			}
		}
	}
	return ""
}
