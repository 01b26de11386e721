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
