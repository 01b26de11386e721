package jobs

import (
	"math"
	"testing"
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
