package computetest

import (
	"context"
	"fmt"

	"github.com/rmsgrad/rmsgrad/compute"
)

// Job is one RMSNorm-backward problem held in host memory. X, W and DY
// hold values exactly representable in their dtypes (WithMix rounds them).
type Job struct {
	Rows, Dim int
	Eps       float32
	X, W, DY  []float32
	// Mix is the dtypes of the job's buffers; the zero Mix is all F32.
	Mix Mix
}

// Mix is the dtypes of one job's tensors: the inputs x, w and dy and the
// outputs dx and dw; "" means F32. r is always F32.
type Mix struct {
	X, W, DY, DX, DW compute.DType
}

// Norm returns m with every "" replaced by F32.
func (m Mix) Norm() Mix {
	for _, p := range []*compute.DType{&m.X, &m.W, &m.DY, &m.DX, &m.DW} {
		if *p == "" {
			*p = compute.F32
		}
	}
	return m
}

// String is e.g. "x=BF16,w=F32,dy=BF16->dx=BF16,dw=F32".
func (m Mix) String() string {
	m = m.Norm()
	return fmt.Sprintf("x=%s,w=%s,dy=%s->dx=%s,dw=%s", m.X, m.W, m.DY, m.DX, m.DW)
}

// Mixes returns the dtype mixes the conformance suite covers: x, w and dy
// each in compute.DTypes, each with the outputs autograd gives (dx like x,
// dw like w) and, where that differs, with F32 outputs: 51 mixes.
func Mixes() []Mix {
	var out []Mix
	for _, x := range compute.DTypes {
		for _, w := range compute.DTypes {
			for _, dy := range compute.DTypes {
				out = append(out, Mix{X: x, W: w, DY: dy, DX: x, DW: w})
				if x != compute.F32 || w != compute.F32 {
					out = append(out, Mix{X: x, W: w, DY: dy, DX: compute.F32, DW: compute.F32})
				}
			}
		}
	}
	return out
}

// WithMix returns a copy of j with mix m, its inputs rounded to their
// dtypes (to nearest even, as compute.DType.Round does).
func (j Job) WithMix(m Mix) Job {
	m = m.Norm()
	round := func(v []float32, dt compute.DType) []float32 {
		out := make([]float32, len(v))
		for i, f := range v {
			out[i] = dt.Round(f)
		}
		return out
	}
	j.X, j.W, j.DY = round(j.X, m.X), round(j.W, m.W), round(j.DY, m.DY)
	j.Mix = m
	return j
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

// Check compares o with the float64 oracle: r, and the outputs of F32 at
// Compare's tolerance, half outputs against the oracle rounded to their
// dtype (CompareRounded).
func (j Job) Check(o Output) error {
	m := j.Mix.Norm()
	r, dx, dw := Oracle(j.X, j.W, j.DY, j.Rows, j.Dim, float64(j.Eps))
	if err := Compare("r", o.R, r, j.Rows, j.Dim); err != nil {
		return err
	}
	k := max(j.Rows, j.Dim)
	if err := CompareRounded("dx", m.DX, o.DX, dx, DXScale(j.X, j.W, j.DY, dx, j.Rows, j.Dim, float64(j.Eps)), k); err != nil {
		return err
	}
	return CompareRounded("dw", m.DW, o.DW, dw, maxAbs(dw), k)
}

// CheckRoundedOnce checks that half is f32 with each half output rounded
// once to its dtype, bit for bit: half and f32 are the outputs of the same
// job (the same inputs) with the outputs of half's mix and with F32
// outputs. It holds when a backend computes in float32 whatever the output
// dtype and rounds to nearest even, and fails for any other rounding (a
// truncation, a double rounding, a result computed in half precision).
func CheckRoundedOnce(f32, half Output, m Mix) error {
	m = m.Norm()
	for _, p := range []struct {
		name     string
		dt       compute.DType
		ref, got []float32
	}{{"r", compute.F32, f32.R, half.R}, {"dx", m.DX, f32.DX, half.DX}, {"dw", m.DW, f32.DW, half.DW}} {
		if len(p.ref) != len(p.got) {
			return fmt.Errorf("%s: length %d vs %d", p.name, len(p.got), len(p.ref))
		}
		for i, v := range p.ref {
			if want := p.dt.Round(v); float32Bits(p.got[i]) != float32Bits(want) {
				return fmt.Errorf("%s (%s)[%d] = %g (%#08x), want the F32 output %g rounded once: %g (%#08x)",
					p.name, p.dt, i, p.got[i], float32Bits(p.got[i]), v, want, float32Bits(want))
			}
		}
	}
	return nil
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
	alloc := func(dt compute.DType, src []float32, shape ...int) (compute.Buffer, error) {
		buf, err := b.Alloc(dt, shape...)
		if err != nil {
			return nil, err
		}
		allocated = append(allocated, buf)
		n := compute.NumElements(shape)
		if got := len(buf.Bytes()); got != n*dt.Size() {
			return nil, fmt.Errorf("Alloc(%s, %v): Bytes has %d bytes, want %d", dt, shape, got, n*dt.Size())
		}
		if dt == compute.F32 && len(buf.Float32s()) != n {
			return nil, fmt.Errorf("Alloc(F32, %v): Float32s has %d elements", shape, len(buf.Float32s()))
		}
		if src == nil {
			// Poison outputs so a kernel that skips an element is caught:
			// a NaN of the dtype in every element.
			nan := poison[dt]
			for i := 0; i < len(buf.Bytes()); i += len(nan) {
				copy(buf.Bytes()[i:], nan)
			}
			return buf, nil
		}
		dt.Encode(buf.Bytes(), src)
		return buf, nil
	}
	for i, j := range jobs {
		var err error
		bb := &all[i]
		m := j.Mix.Norm()
		if bb.x, err = alloc(m.X, j.X, j.Rows, j.Dim); err != nil {
			return nil, err
		}
		if bb.w, err = alloc(m.W, j.W, j.Dim); err != nil {
			return nil, err
		}
		if bb.dy, err = alloc(m.DY, j.DY, j.Rows, j.Dim); err != nil {
			return nil, err
		}
		if bb.r, err = alloc(compute.F32, nil, j.Rows); err != nil {
			return nil, err
		}
		if bb.dx, err = alloc(m.DX, nil, j.Rows, j.Dim); err != nil {
			return nil, err
		}
		if bb.dw, err = alloc(m.DW, nil, j.Dim); err != nil {
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
		outs[i] = Output{R: Read(all[i].r), DX: Read(all[i].dx), DW: Read(all[i].dw)}
	}
	return outs, nil
}

// Read returns a copy of buf's values as float32s, decoded from its dtype
// (exactly).
func Read(buf compute.Buffer) []float32 {
	v := make([]float32, buf.Len())
	buf.DType().Decode(v, buf.Bytes())
	return v
}

// poison is a NaN of each dtype, little-endian.
var poison = map[compute.DType][]byte{compute.F32: {0xad, 0x0b, 0xc0, 0x7f}, compute.BF16: {0xad, 0x7f}, compute.F16: {0xad, 0x7e}}

// RunJob runs one job in its own command buffer.
func RunJob(ctx context.Context, b compute.Backend, j Job) (Output, error) {
	o, err := RunJobs(ctx, b, []Job{j}, DXThenDW)
	if err != nil {
		return Output{}, err
	}
	return o[0], nil
}

// BitsEqual reports the first element where a and b differ bitwise
// (NaNs included), or "" when they are identical. Half outputs compare
// as their float32 values, which are their bits exactly (the widening is
// one-to-one).
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
