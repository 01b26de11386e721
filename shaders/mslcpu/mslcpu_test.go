package mslcpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/shaders"
)

// The driver is built once per test run into a temp dir (buildDir); broken
// variants are built next to it on demand.
var (
	buildDir  string
	buildOnce sync.Once
	driver    string
	buildErr  error
)

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "mslcpu-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

// skipNoCompiler skips (or, under RMSGRAD_REQUIRE_SERVERS=1, fails) when the
// C++ compiler is missing.
func skipNoCompiler(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNoCompiler) {
		msg := fmt.Sprintf("msl-cpu needs g++ (scripts/test.sh installs it): %v", err)
		if os.Getenv("RMSGRAD_REQUIRE_SERVERS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// testBackend returns a backend running the real shader.
func testBackend(t testing.TB, threads int) *Backend {
	t.Helper()
	return testBackendWith(t, Options{Threads: threads})
}

// testBackendWith returns a backend running the real shader with opts
// (Driver filled in).
func testBackendWith(t testing.TB, opts Options) *Backend {
	t.Helper()
	buildOnce.Do(func() {
		dir := filepath.Join(buildDir, "shader")
		if buildErr = os.MkdirAll(dir, 0o755); buildErr == nil {
			driver, buildErr = Build(context.Background(), BuildOptions{Dir: dir})
		}
	})
	skipNoCompiler(t, buildErr)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	opts.Driver = driver
	b, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// brokenBackend builds the shader with old replaced by new (which must occur
// exactly once) and returns a backend running it with opts.
func brokenBackend(t *testing.T, old, new string, opts Options) *Backend {
	t.Helper()
	if n := strings.Count(shaders.MetalSource, old); n != 1 {
		t.Fatalf("the substitution's target occurs %d times in the shader, want 1: %q", n, old)
	}
	dir := filepath.Join(buildDir, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := Build(context.Background(), BuildOptions{Dir: dir, Source: strings.Replace(shaders.MetalSource, old, new, 1)})
	skipNoCompiler(t, err)
	if err != nil {
		t.Fatal(err)
	}
	opts.Driver = d
	b, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// job is one RMSNorm-backward problem with deterministic inputs.
type job struct {
	rows, dim  int
	eps        float32
	x, w, dy   []float32
	r, dx, dw  []float32 // outputs
	bx, bw, bd compute.Buffer
	br, bdx    compute.Buffer
	bdw        compute.Buffer
}

// lcg gives reproducible values in [-1, 1).
type lcg uint64

func (s *lcg) next() float32 {
	*s = *s*6364136223846793005 + 1442695040888963407
	return float32(int64(*s>>11)-(1<<52)) / (1 << 52)
}

func newJob(rows, dim int, seed uint64, scale float32) *job {
	j := &job{rows: rows, dim: dim, eps: 1e-6}
	s := lcg(seed)
	n := rows * dim
	j.x, j.dy, j.w = make([]float32, n), make([]float32, n), make([]float32, dim)
	for i := range j.x {
		j.x[i] = s.next() * scale
		j.dy[i] = s.next() * 0.3
	}
	for i := range j.w {
		j.w[i] = 1 + 0.1*s.next()
	}
	return j
}

func (j *job) alloc(t testing.TB, b compute.Backend) {
	t.Helper()
	var err error
	mk := func(src []float32, shape ...int) compute.Buffer {
		if err != nil {
			return nil
		}
		var buf compute.Buffer
		buf, err = b.Alloc(compute.F32, shape...)
		if err == nil && src != nil {
			copy(buf.Float32s(), src)
		}
		return buf
	}
	j.bx, j.bw, j.bd = mk(j.x, j.rows, j.dim), mk(j.w, j.dim), mk(j.dy, j.rows, j.dim)
	j.br, j.bdx, j.bdw = mk(nil, j.rows), mk(nil, j.rows, j.dim), mk(nil, j.dim)
	if err != nil {
		t.Fatal(err)
	}
}

func (j *job) recordInv(cb *compute.CommandBuffer) error {
	return cb.RMSInv(j.bx, j.br, compute.RMSInvParams(j.eps, j.dim), j.rows, j.dim)
}

func (j *job) recordGrads(cb *compute.CommandBuffer) error {
	if err := cb.DX(j.bx, j.bw, j.bd, j.br, j.bdx, compute.DXParams(j.dim, j.eps), j.rows, j.dim); err != nil {
		return err
	}
	return cb.DW(j.bx, j.bd, j.br, j.bdw, compute.DWParams(j.dim, j.rows), j.rows, j.dim)
}

func (j *job) collect() {
	j.r = append([]float32(nil), j.br.Float32s()...)
	j.dx = append([]float32(nil), j.bdx.Float32s()...)
	j.dw = append([]float32(nil), j.bdw.Float32s()...)
}

// runJobs records every job into one command buffer (all rms_inv, barrier,
// all dx/dw), commits it and collects the outputs.
func runJobs(t testing.TB, b compute.Backend, jobs ...*job) error {
	t.Helper()
	cb := compute.NewCommandBuffer(b)
	for _, j := range jobs {
		j.alloc(t, b)
		if err := j.recordInv(cb); err != nil {
			t.Fatal(err)
		}
	}
	cb.Barrier()
	for _, j := range jobs {
		if err := j.recordGrads(cb); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cb.Commit(context.Background()); err != nil {
		return err
	}
	for _, j := range jobs {
		j.collect()
	}
	return nil
}

// checkOracle compares a job's outputs with a float64 evaluation of the same
// formulas. Tolerance: each output is a sum of at most max(rows, dim) <= 8192
// f32 products; with fixed-order (partly tree) f32 accumulation the rounding
// error is bounded by about n*2^-24 times the sum of the absolute values of
// the terms, and in practice (random signs) ~sqrt(n)*2^-24 of it. We allow
// 2e-5 of that absolute scale (about 2^-15.6: above the sqrt(8192)*2^-24 =
// 5.4e-6 typical error, far below the errors of a dropped or duplicated
// term, which are of the order of one term).
func checkOracle(j *job) error {
	const tol = 2e-5
	rows, dim := j.rows, j.dim
	for b := range rows {
		var ss float64
		for i := range dim {
			v := float64(j.x[b*dim+i])
			ss += v * v
		}
		r := 1 / math.Sqrt(ss/float64(dim)+float64(j.eps))
		if d := math.Abs(float64(j.r[b]) - r); !(d <= tol*r) { // NaN fails too
			return fmt.Errorf("%dx%d: r[%d] = %g, oracle %g", rows, dim, b, j.r[b], r)
		}
		var s, sAbs float64
		for i := range dim {
			t := float64(j.dy[b*dim+i]) * float64(j.x[b*dim+i]) * float64(j.w[i])
			s += t
			sAbs += math.Abs(t)
		}
		for k := range dim {
			x, dy, w := float64(j.x[b*dim+k]), float64(j.dy[b*dim+k]), float64(j.w[k])
			want := r * (dy*w - x*s*r*r/float64(dim))
			scale := r * (math.Abs(dy*w) + math.Abs(x)*sAbs*r*r/float64(dim))
			if dim == 1 {
				// The exact form (compute.DXDim1), held to a relative
				// bound: the general one cancels here.
				want = dy * w * float64(j.eps) * r * r * r
				scale = math.Abs(want)
			}
			if d := math.Abs(float64(j.dx[b*dim+k]) - want); !(d <= tol*scale+1e-30) {
				return fmt.Errorf("%dx%d: dx[%d,%d] = %g, oracle %g (scale %g)", rows, dim, b, k, j.dx[b*dim+k], want, scale)
			}
		}
	}
	// dw against the backend's own r (checked above), so that a dw error is
	// reported as such.
	for i := range dim {
		var want, scale float64
		for b := range rows {
			t := float64(j.dy[b*dim+i]) * float64(j.x[b*dim+i]) * float64(j.r[b])
			want += t
			scale += math.Abs(t)
		}
		if d := math.Abs(float64(j.dw[i]) - want); !(d <= tol*scale+1e-30) {
			return fmt.Errorf("%dx%d: dw[%d] = %g, oracle %g (scale %g)", rows, dim, i, j.dw[i], want, scale)
		}
	}
	return nil
}
