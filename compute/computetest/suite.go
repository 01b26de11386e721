package computetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

// Options tunes Run for a backend.
type Options struct {
	// SkipLarge skips the shapes over LargeElements elements (1000x4097,
	// 1000x8192) and shrinks the batching and determinism jobs. Set it only
	// for slow test backends such as msl-cpu; real backends run everything.
	SkipLarge bool
}

// LargeElements is the size above which a case counts as large.
const LargeElements = 1 << 20

// Run is the conformance suite: it runs every case as a subtest on a
// backend from open (called once per subtest; the backend is closed by
// the subtest's cleanup). opts is optional; its first element is used.
// DTypeMixes and DTypeBatching cover the half dtypes; they skip, naming
// the backend, only when its Alloc of BF16 returns an error wrapping
// compute.ErrUnsupported.
func Run(t *testing.T, open func(t *testing.T) compute.Backend, opts ...Options) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	s := &suite{open: func(t *testing.T) compute.Backend {
		t.Helper()
		b := open(t)
		t.Cleanup(func() {
			if err := b.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return b
	}, opts: o}
	t.Run("Parity2x32", s.parity2x32)
	t.Run("Parity8x1024", s.parity8x1024)
	t.Run("UnitWeights", s.unitWeights)
	t.Run("FiniteDifference", s.finiteDifference)
	t.Run("Shapes", s.shapes)
	t.Run("Dim1", s.dim1)
	t.Run("Magnitudes", s.magnitudes)
	t.Run("Validation", func(t *testing.T) { RunValidation(t, s.open) })
	t.Run("Batching", s.batching)
	t.Run("Determinism", s.determinism)
	t.Run("DTypeMixes", s.dtypeMixes)
	t.Run("DTypeBatching", s.dtypeBatching)
}

type suite struct {
	open func(t *testing.T) compute.Backend
	opts Options
}

func (s *suite) check(t *testing.T, b compute.Backend, j Job) Output {
	t.Helper()
	o, err := RunJob(context.Background(), b, j)
	if err != nil {
		t.Fatalf("%dx%d: %v", j.Rows, j.Dim, err)
	}
	if err := j.Check(o); err != nil {
		t.Fatalf("%dx%d: %v", j.Rows, j.Dim, err)
	}
	return o
}

// The seed's fixtures, regenerated from the same closed forms.
func (s *suite) parity2x32(t *testing.T) {
	rows, dim := 2, 32
	j := Job{Rows: rows, Dim: dim, Eps: 1e-6}
	for i := 0; i < rows*dim; i++ {
		j.X = append(j.X, float32(math.Sin(float64(float32(i)*0.0173)))*0.5)
		j.DY = append(j.DY, float32(math.Cos(float64(float32(i)*0.0271)))*0.3)
	}
	for i := 0; i < dim; i++ {
		j.W = append(j.W, 1+0.1*(float32(i)-16))
	}
	s.check(t, s.open(t), j)
}

func (s *suite) parity8x1024(t *testing.T) {
	rows, dim := 8, 1024
	j := Job{Rows: rows, Dim: dim, Eps: 1e-6}
	for i := 0; i < rows*dim; i++ {
		j.X = append(j.X, float32(math.Sin(float64(float32(i)*0.0073)))*0.42)
		j.DY = append(j.DY, float32(math.Cos(float64(float32(i)*0.013)))*0.28)
	}
	for i := 0; i < dim; i++ {
		j.W = append(j.W, 1+float32(math.Cos(float64(float32(i)*0.011)))*0.05)
	}
	s.check(t, s.open(t), j)
}

// With w == 1, dx = r*(dy - x*s*r^2/D) and dw = sum_b dy*x*r: pinned both
// against the oracle and against the simpler closed form.
func (s *suite) unitWeights(t *testing.T) {
	rows, dim := 4, 64
	j := Job{Rows: rows, Dim: dim, Eps: 1e-6}
	for i := 0; i < rows*dim; i++ {
		j.X = append(j.X, float32(i)*0.001-0.1)
		j.DY = append(j.DY, float32(i)*0.0007-0.05)
	}
	for i := 0; i < dim; i++ {
		j.W = append(j.W, 1)
	}
	o := s.check(t, s.open(t), j)
	simple := make([]float64, rows*dim)
	for b := 0; b < rows; b++ {
		var ss, sdot float64
		for i := 0; i < dim; i++ {
			x, dy := float64(j.X[b*dim+i]), float64(j.DY[b*dim+i])
			ss += x * x
			sdot += dy * x
		}
		r := 1 / math.Sqrt(ss/float64(dim)+float64(j.Eps))
		for i := 0; i < dim; i++ {
			x, dy := float64(j.X[b*dim+i]), float64(j.DY[b*dim+i])
			simple[b*dim+i] = r * (dy - x*sdot*r*r/float64(dim))
		}
	}
	if err := Compare("dx (w=1 closed form)", o.DX, simple, rows, dim); err != nil {
		t.Fatal(err)
	}
}

// lossFD is L = sum dy*y with y = x*r*w, all in float64, so the central
// difference is accurate to about h^2.
func lossFD(x, w, dy []float64, rows, dim int, eps float64) float64 {
	var l float64
	for b := 0; b < rows; b++ {
		var ss float64
		for i := 0; i < dim; i++ {
			ss += x[b*dim+i] * x[b*dim+i]
		}
		r := 1 / math.Sqrt(ss/float64(dim)+eps)
		for i := 0; i < dim; i++ {
			l += dy[b*dim+i] * x[b*dim+i] * r * w[i]
		}
	}
	return l
}

// finiteDifference falsifies the backward formula itself: dx and dw must be
// the gradients of L = sum(dy * y) measured by central differences, so a
// backend (or an oracle) with a wrong but self-consistent formula fails.
func (s *suite) finiteDifference(t *testing.T) {
	rows, dim := 2, 32
	j := NewJob(12347, rows, dim)
	j.Eps = 1e-6
	o := s.check(t, s.open(t), j)
	f64 := func(v []float32) []float64 {
		out := make([]float64, len(v))
		for i, f := range v {
			out[i] = float64(f)
		}
		return out
	}
	x, w, dy := f64(j.X), f64(j.W), f64(j.DY)
	eps := float64(j.Eps)
	const h = 1e-4
	// Central differences in float64 at h = 1e-4 are accurate to ~1e-8;
	// the float32 gradient to ~1e-6. 1e-4 absolute (values are O(0.1..1))
	// still catches a wrong sign, factor or missing term.
	const tol = 1e-4
	for _, k := range []int{0, 7, 31, 32, 47, 63} {
		xp, xm := append([]float64(nil), x...), append([]float64(nil), x...)
		xp[k] += h
		xm[k] -= h
		fd := (lossFD(xp, w, dy, rows, dim, eps) - lossFD(xm, w, dy, rows, dim, eps)) / (2 * h)
		if d := math.Abs(fd - float64(o.DX[k])); !(d <= tol) {
			t.Errorf("dx[%d] = %g, finite difference %g (|diff| %g)", k, o.DX[k], fd, d)
		}
	}
	for _, k := range []int{0, 5, 15, 31} {
		wp, wm := append([]float64(nil), w...), append([]float64(nil), w...)
		wp[k] += h
		wm[k] -= h
		fd := (lossFD(x, wp, dy, rows, dim, eps) - lossFD(x, wm, dy, rows, dim, eps)) / (2 * h)
		if d := math.Abs(fd - float64(o.DW[k])); !(d <= tol) {
			t.Errorf("dw[%d] = %g, finite difference %g (|diff| %g)", k, o.DW[k], fd, d)
		}
	}
}

func (s *suite) shapes(t *testing.T) {
	type shape struct{ rows, dim int }
	var cases []shape
	for _, d := range []int{1, 3, 257, 4097, 5120, 8192} {
		cases = append(cases, shape{7, d})
	}
	for _, r := range []int{1, 7, 1000} {
		cases = append(cases, shape{r, 257}, shape{r, 1})
	}
	cases = append(cases, shape{1000, 4097}, shape{1000, 8192}, shape{3, 33}, shape{65, 31})
	b := s.open(t)
	for i, c := range cases {
		t.Run(fmt.Sprintf("%dx%d", c.rows, c.dim), func(t *testing.T) {
			if s.opts.SkipLarge && c.rows*c.dim > LargeElements {
				t.Skip("large shape skipped by Options.SkipLarge")
			}
			s.check(t, b, NewJob(uint64(100+i), c.rows, c.dim))
		})
	}
}

func (s *suite) magnitudes(t *testing.T) {
	b := s.open(t)
	scaled := func(seed uint64, rows, dim int, xs float32) Job {
		j := NewJob(seed, rows, dim)
		for i := range j.X {
			j.X[i] *= xs
		}
		return j
	}
	t.Run("Large1e4", func(t *testing.T) { s.check(t, b, scaled(1, 16, 1024, 1e4)) })
	t.Run("Tiny1e-20", func(t *testing.T) {
		// x^2 ~ 1e-40 is subnormal; eps dominates, so r = 1/sqrt(eps).
		j := scaled(2, 16, 1024, 1e-20)
		o := s.check(t, b, j)
		want := 1 / math.Sqrt(float64(j.Eps))
		for i, r := range o.R {
			if math.Abs(float64(r)-want) > 1e-6*want {
				t.Fatalf("r[%d] = %g, want 1/sqrt(eps) = %g", i, r, want)
			}
		}
	})
	t.Run("ZeroRow", func(t *testing.T) {
		j := NewJob(3, 8, 300)
		for i := 2 * 300; i < 3*300; i++ {
			j.X[i] = 0
		}
		o := s.check(t, b, j)
		for i := 2 * 300; i < 3*300; i++ {
			if math.IsNaN(float64(o.DX[i])) || math.IsInf(float64(o.DX[i]), 0) {
				t.Fatalf("dx[%d] = %g for an all-zero row", i, o.DX[i])
			}
		}
	})
	t.Run("ZeroDY", func(t *testing.T) {
		j := NewJob(4, 5, 100)
		clear(j.DY)
		o := s.check(t, b, j)
		for i, v := range append(o.DX, o.DW...) {
			if v != 0 {
				t.Fatalf("output %d = %g with dy = 0", i, v)
			}
		}
	})
}

// dim1: with D = 1 the general dx form cancels (1 - x^2 r^2 with
// x^2 >> eps); every backend must use the exact form (compute.DXDim1), and
// CompareDX holds dim-1 dx to the plain normwise bound. eps 1e-6 and x near
// 1 make the cancellation worst: the general form misses by about 1e-2 of
// dx there, the bound at k = 1000 is 1.5e-5.
func (s *suite) dim1(t *testing.T) {
	b := s.open(t)
	one := Job{Rows: 1, Dim: 1, Eps: 1e-6, X: []float32{1}, W: []float32{1.5}, DY: []float32{0.25}}
	s.check(t, b, one)
	j := NewJob(77, 1000, 1)
	j.Eps = 1e-6
	for i := range j.X {
		j.X[i] = 0.5 + j.X[i]/2 // [0, 1): mostly x^2 >> eps
	}
	s.check(t, b, j)
}

// mixedJobs returns n jobs of mixed shapes, deterministic in seed.
func mixedJobs(seed uint64, n int, skipLarge bool) []Job {
	dims := []int{1, 3, 32, 257, 1024, 4097}
	rowsSet := []int{1, 2, 7, 8, 33, 130}
	g := NewSplitMix64(seed)
	jobs := make([]Job, n)
	for i := range jobs {
		d := dims[g.Uint64()%uint64(len(dims))]
		r := rowsSet[g.Uint64()%uint64(len(rowsSet))]
		if skipLarge && r*d > LargeElements/8 {
			r = 1
		}
		jobs[i] = NewJob(seed*1000+uint64(i), r, d)
	}
	return jobs
}

// batching: 50 mixed jobs in one command buffer give bitwise the outputs of
// each job alone, in every recording order.
func (s *suite) batching(t *testing.T) {
	b := s.open(t)
	ctx := context.Background()
	jobs := mixedJobs(7, 50, s.opts.SkipLarge)
	alone := make([]Output, len(jobs))
	for i, j := range jobs {
		o, err := RunJob(ctx, b, j)
		if err != nil {
			t.Fatalf("job %d alone: %v", i, err)
		}
		if err := j.Check(o); err != nil {
			t.Fatalf("job %d (%dx%d) alone: %v", i, j.Rows, j.Dim, err)
		}
		alone[i] = o
	}
	for _, order := range []Order{DXThenDW, AllDXThenAllDW, Reversed} {
		outs, err := RunJobs(ctx, b, jobs, order)
		if err != nil {
			t.Fatalf("order %d: %v", order, err)
		}
		for i := range jobs {
			if d := BitsEqual(outs[i], alone[i]); d != "" {
				t.Fatalf("order %d: job %d (%dx%d) batched differs from alone: %s", order, i, jobs[i].Rows, jobs[i].Dim, d)
			}
		}
	}
}

// determinism: repeated runs, GOMAXPROCS 1 and 2 (and the machine's), and
// different batch compositions give bitwise-identical outputs.
func (s *suite) determinism(t *testing.T) {
	b := s.open(t)
	ctx := context.Background()
	big := 256 * 1024
	if s.opts.SkipLarge {
		big = 64 * 512
	}
	target := NewJob(99, big/1024, 1024) // enough rows to split into blocks
	odd := NewJob(98, 37, 4097)
	ref, err := RunJobs(ctx, b, []Job{target, odd}, DXThenDW)
	if err != nil {
		t.Fatal(err)
	}
	if err := target.Check(ref[0]); err != nil {
		t.Fatal(err)
	}
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	for _, procs := range []int{1, 2, prev, 1} {
		runtime.GOMAXPROCS(procs)
		for rep := 0; rep < 2; rep++ {
			got, err := RunJobs(ctx, b, []Job{target, odd}, DXThenDW)
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if d := BitsEqual(got[i], ref[i]); d != "" {
					t.Fatalf("GOMAXPROCS=%d run %d job %d: %s", procs, rep, i, d)
				}
			}
		}
	}
	runtime.GOMAXPROCS(prev)
	// Other compositions: alone, among many others, last, reversed.
	others := mixedJobs(11, 12, s.opts.SkipLarge)
	comps := [][]Job{
		{target},
		append(append([]Job{}, others...), target),
		append([]Job{target}, others...),
	}
	for ci, comp := range comps {
		for _, order := range []Order{DXThenDW, Reversed} {
			got, err := RunJobs(ctx, b, comp, order)
			if err != nil {
				t.Fatal(err)
			}
			idx := 0
			if ci == 1 {
				idx = len(comp) - 1
			}
			if d := BitsEqual(got[idx], ref[0]); d != "" {
				t.Fatalf("composition %d order %d: %s", ci, order, d)
			}
		}
	}
}

// errorIs asserts err is an *ArgError for kernel k and argument arg that
// matches ErrInvalidArgument.
func errorIs(t *testing.T, err error, k compute.Kernel, arg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want an invalid %s of %s", arg, k)
	}
	if !errors.Is(err, compute.ErrInvalidArgument) {
		t.Fatalf("errors.Is(%v, ErrInvalidArgument) = false", err)
	}
	var ae *compute.ArgError
	if !errors.As(err, &ae) {
		t.Fatalf("errors.As(%v, *ArgError) = false", err)
	}
	if ae.Kernel != k || ae.Arg != arg {
		t.Fatalf("ArgError{Kernel: %q, Arg: %q}, want %q, %q (%v)", ae.Kernel, ae.Arg, k, arg, err)
	}
	if ae.Want == "" || ae.Got == "" {
		t.Fatalf("ArgError %v does not say what was expected and given", err)
	}
}
