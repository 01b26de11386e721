package jobs

import (
	"math"
	"testing"
)

// TestAllFiniteAgreesWithTheExactScan plants each non-finite value (and
// the largest finite ones, whose exponent is one below all ones) at every
// position of slices of every length up to 19, across the unrolled body
// and the tail, and checks allFinite against a per-value scan.
func TestAllFiniteAgreesWithTheExactScan(t *testing.T) {
	vals := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		math.Float32frombits(0x7fffffff), math.Float32frombits(0xff800001),
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 0, 1}
	for _, x := range vals {
		for n := 1; n < 20; n++ {
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
				if err := checkFinite(v); (err == nil) != want {
					t.Fatalf("checkFinite with %v at %d of %d = %v", x, p, n, err)
				}
			}
		}
	}
	if !allFinite(nil) {
		t.Fatal("allFinite(nil) = false")
	}
}

func BenchmarkCheckFinite(b *testing.B) {
	v := make([]float32, 8192)
	for i := range v {
		v[i] = float32(i%2000-1000) / 1000
	}
	b.SetBytes(int64(4 * len(v)))
	for b.Loop() {
		if err := checkFinite(v); err != nil {
			b.Fatal(err)
		}
	}
}
