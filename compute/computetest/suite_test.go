package computetest_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
)

// broken wraps a correct backend and corrupts its results after Execute,
// to show the suite's checks fail on plausible bugs.
type broken struct {
	compute.Backend
	corrupt func(ops []compute.Op)
}

func (b broken) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	d, err := b.Backend.Execute(ctx, ops)
	if err == nil {
		b.corrupt(ops)
	}
	return d, err
}

func TestOracleAgreesWithCPU(t *testing.T) {
	j := computetest.NewJob(1, 16, 300)
	o, err := computetest.RunJob(context.Background(), cpu.New(), j)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Check(o); err != nil {
		t.Fatal(err)
	}
}

// TestChecksCatchBugs: each corruption is small (one term, one element, a
// relative 1e-4) and each must be caught by Job.Check.
func TestChecksCatchBugs(t *testing.T) {
	j := computetest.NewJob(2, 64, 1024)
	for _, c := range []struct {
		name    string
		corrupt func(op compute.Op)
	}{
		{"dw drops the last row's term", func(op compute.Op) {
			if op.Kind != compute.OpDW {
				return
			}
			x, dy, r, dw := op.X.Float32s(), op.DY.Float32s(), op.R.Float32s(), op.DW.Float32s()
			b := op.Rows - 1
			for i := range dw {
				dw[i] -= dy[b*op.Dim+i] * x[b*op.Dim+i] * r[b]
			}
		}},
		{"dx off by 1e-4 relative in one element", func(op compute.Op) {
			if op.Kind == compute.OpDX {
				op.DX.Float32s()[77] *= 1 + 1e-4
			}
		}},
		{"one r off by 1e-3 relative", func(op compute.Op) {
			if op.Kind == compute.OpRMSInv {
				op.R.Float32s()[3] *= 1.001
			}
		}},
		{"dx skips the last element", func(op compute.Op) {
			if op.Kind == compute.OpDX {
				dx := op.DX.Float32s()
				dx[len(dx)-1] = 0
			}
		}},
		{"dx NaN", func(op compute.Op) {
			if op.Kind == compute.OpDX {
				op.DX.Float32s()[5] = float32(math.NaN())
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := broken{cpu.New(), func(ops []compute.Op) {
				for _, op := range ops {
					c.corrupt(op)
				}
			}}
			o, err := computetest.RunJob(context.Background(), b, j)
			if err != nil {
				t.Fatal(err)
			}
			if err := j.Check(o); err == nil {
				t.Fatal("corruption not detected")
			}
		})
	}
}

func TestBitsEqual(t *testing.T) {
	a := computetest.Output{R: []float32{1}, DX: []float32{0, 2}, DW: []float32{3}}
	b := computetest.Output{R: []float32{1}, DX: []float32{float32(math.Copysign(0, -1)), 2}, DW: []float32{3}}
	if d := computetest.BitsEqual(a, a); d != "" {
		t.Fatal(d)
	}
	if d := computetest.BitsEqual(a, b); !strings.HasPrefix(d, "dx[0]") {
		t.Fatalf("+0 vs -0: %q", d)
	}
}

func TestUniformDeterministic(t *testing.T) {
	a, b := computetest.Uniform(42, 1000, 2), computetest.Uniform(42, 1000, 2)
	for i := range a {
		if a[i] != b[i] || a[i] < -2 || a[i] >= 2 {
			t.Fatalf("Uniform[%d] = %g, %g", i, a[i], b[i])
		}
	}
	// Pin the stream: a change of generator would silently change every
	// synthetic job and fixture.
	if got := computetest.NewSplitMix64(0).Uint64(); got != 0xe220a8397b1dcdaf {
		t.Fatalf("SplitMix64(0) first value %#x", got)
	}
}

// brokenInput runs a correct backend after rewriting the inputs the way a
// kernel that misreads a dtype would see them.
type brokenInput struct {
	compute.Backend
	before func(ops []compute.Op)
}

func (b brokenInput) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	b.before(ops)
	return b.Backend.Execute(ctx, ops)
}

// TestChecksCatchHalfBugs: with half dtypes, Job.Check catches a wrong
// reading of an input's dtype, and CheckRoundedOnce catches an output one
// ULP off or rounded another way, which Check's one-ULP bound lets through.
func TestChecksCatchHalfBugs(t *testing.T) {
	m := computetest.Mix{X: compute.BF16, W: compute.BF16, DY: compute.BF16, DX: compute.BF16, DW: compute.BF16}
	j := computetest.NewJob(3, 16, 300).WithMix(m)
	f := j
	f.Mix.DX, f.Mix.DW = compute.F32, compute.F32
	ctx := context.Background()
	ref, err := computetest.RunJob(ctx, cpu.New(), f)
	if err != nil {
		t.Fatal(err)
	}
	good, err := computetest.RunJob(ctx, cpu.New(), j)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Check(good); err != nil {
		t.Fatal(err)
	}
	if err := computetest.CheckRoundedOnce(ref, good, m); err != nil {
		t.Fatal(err)
	}

	// x's BF16 bytes read as F16.
	misread := brokenInput{cpu.New(), func(ops []compute.Op) {
		for _, op := range ops {
			if op.Kind == compute.OpRMSInv {
				v := make([]float32, op.X.Len())
				compute.F16.Decode(v, op.X.Bytes())
				for i := range v {
					if v[i] != v[i] || v[i] > 1e4 || v[i] < -1e4 {
						v[i] = 0
					}
				}
				compute.BF16.Encode(op.X.Bytes(), v)
			}
		}
	}}
	o, err := computetest.RunJob(ctx, misread, j)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Check(o); err == nil {
		t.Fatal("x read as F16: not detected")
	}

	for _, c := range []struct {
		name    string
		corrupt func(h []byte)
	}{
		{"one dx element one ULP off", func(h []byte) { h[2*77]++ }},
		{"every dx element truncated", func(h []byte) {
			// Recompute each element from the F32 result by dropping the
			// low bits: the rounding toward zero a sloppy kernel makes.
			for i, v := range ref.DX {
				b := math.Float32bits(v) >> 16
				h[2*i], h[2*i+1] = byte(b), byte(b>>8)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := broken{cpu.New(), func(ops []compute.Op) {
				for _, op := range ops {
					if op.Kind == compute.OpDX {
						c.corrupt(op.DX.Bytes())
					}
				}
			}}
			o, err := computetest.RunJob(ctx, b, j)
			if err != nil {
				t.Fatal(err)
			}
			if err := computetest.CheckRoundedOnce(ref, o, m); err == nil {
				t.Fatal("corruption not detected by CheckRoundedOnce")
			}
		})
	}
}

// TestCompareRoundedBound: the half comparison accepts the neighbours of
// the rounded value and nothing further, away from cancellation.
func TestCompareRoundedBound(t *testing.T) {
	want := []float64{1.5 + 1.0/512} // between two BF16 values (1.5 and 1.5+1/128), nearer 1.5
	for _, c := range []struct {
		got float32
		ok  bool
	}{{1.5, true}, {1.5 + 1.0/128, true}, {1.5 - 1.0/128, true}, {1.5 + 2.0/128, false}, {1.5 - 2.0/128, false}} {
		err := computetest.CompareRounded("v", compute.BF16, []float32{c.got}, want, 1e-3, 8)
		if (err == nil) != c.ok {
			t.Errorf("got %v: %v, want ok=%v", c.got, err, c.ok)
		}
	}
}
