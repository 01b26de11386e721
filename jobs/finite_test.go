package jobs

import (
	"math"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

// finiteLengths covers the SWAR loop's body and tail (1..19) and, for the
// AVX2 path, one block and its edges, several blocks, and blocks plus
// every tail length class.
var finiteLengths = func() []int {
	var ns []int
	for n := 1; n < 20; n++ {
		ns = append(ns, n)
	}
	return append(ns, 31, 32, 33, 39, 63, 64, 65, 96, 127, 128, 135, 161)
}()

// TestAllFiniteAgreesWithTheExactScan plants each non-finite value (and
// the largest finite ones, whose exponent is one below all ones) at every
// position of slices of finiteLengths, and checks allFinite (AVX2 where
// the CPU has it), allFiniteSWAR and checkFinite against a per-value scan.
func TestAllFiniteAgreesWithTheExactScan(t *testing.T) {
	vals := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		math.Float32frombits(0x7fffffff), math.Float32frombits(0xff800001),
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 0, 1}
	for _, x := range vals {
		for _, n := range finiteLengths {
			for p := 0; p < n; p++ {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(i) - 3.5
				}
				v[p] = x
				want := true
				for _, f := range v {
					if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
						want = false
					}
				}
				if got := allFinite(v); got != want {
					t.Fatalf("allFinite with %v (bits %#x) at %d of %d = %v, want %v", x, math.Float32bits(x), p, n, got, want)
				}
				if got := allFiniteSWAR(v); got != want {
					t.Fatalf("allFiniteSWAR with %v (bits %#x) at %d of %d = %v, want %v", x, math.Float32bits(x), p, n, got, want)
				}
				if err := checkFinite(v); (err == nil) != want {
					t.Fatalf("checkFinite with %v at %d of %d = %v", x, p, n, err)
				}
			}
		}
	}
	if !allFinite(nil) || !allFiniteSWAR(nil) {
		t.Fatal("allFinite(nil) = false")
	}
}

// BenchmarkCheckFinite scans one 8x1024 tensor (32 KiB, a small job's x),
// with allFinite as the worker runs it and with the portable loop.
func BenchmarkCheckFinite(b *testing.B) {
	v := make([]float32, 8192)
	for i := range v {
		v[i] = float32(i%2000-1000) / 1000
	}
	b.Run("allFinite", func(b *testing.B) {
		b.SetBytes(int64(4 * len(v)))
		for b.Loop() {
			if err := checkFinite(v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("swar", func(b *testing.B) {
		b.SetBytes(int64(4 * len(v)))
		for b.Loop() {
			if !allFiniteSWAR(v) {
				b.Fatal("not finite")
			}
		}
	})
}

// TestAllFinite16AgreesWithTheExactScan is the same test for BF16 and F16
// bits: every non-finite pattern kind (±Inf, quiet and signalling NaN) and
// the largest finite ones, at every position of lengths around the SWAR
// and AVX2 blocks (4 and 64 values).
func TestAllFinite16AgreesWithTheExactScan(t *testing.T) {
	var lengths []int
	for n := 1; n < 20; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 63, 64, 65, 127, 128, 129, 200)
	for _, c := range []struct {
		dt   compute.DType
		vals []uint16
	}{
		{compute.BF16, []uint16{0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff, 0x7f7f, 0xff7f, 0x0001, 0x0000, 0x3f80}},
		{compute.F16, []uint16{0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff, 0x7bff, 0xfbff, 0x0001, 0x0000, 0x3c00}},
	} {
		exp, _ := halfExp(c.dt)
		for _, x := range c.vals {
			for _, n := range lengths {
				for p := 0; p < n; p++ {
					v := make([]uint16, n)
					for i := range v {
						v[i] = uint16(0x3c00 + i%7) // finite in both formats
					}
					v[p] = x
					want := x&exp != exp
					if got := allFinite16(v, c.dt); got != want {
						t.Fatalf("%s allFinite16 with %#04x at %d of %d = %v, want %v", c.dt, x, p, n, got, want)
					}
					e, o := halfExp(c.dt)
					if got := allFinite16SWAR(v, e, o); got != want {
						t.Fatalf("%s allFinite16SWAR with %#04x at %d of %d = %v, want %v", c.dt, x, p, n, got, want)
					}
					if err := checkFinite16(c.dt, v); (err == nil) != want {
						t.Fatalf("%s checkFinite16 with %#04x at %d of %d = %v", c.dt, x, p, n, err)
					}
				}
			}
		}
		if !allFinite16(nil, c.dt) {
			t.Fatalf("%s: allFinite16(nil) = false", c.dt)
		}
	}
}

// BenchmarkCheckFinite16 scans one 8x1024 BF16 tensor (16 KiB).
func BenchmarkCheckFinite16(b *testing.B) {
	v := make([]uint16, 8192)
	for i := range v {
		v[i] = uint16(0x3f00 + i%64)
	}
	b.SetBytes(int64(2 * len(v)))
	for b.Loop() {
		if err := checkFinite16(compute.BF16, v); err != nil {
			b.Fatal(err)
		}
	}
}
