package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// variants are the primitive sets this CPU can run: best, and on amd64 the
// narrower ones pickPrims would choose on CPUs with fewer features.
func primVariants() map[string]*prims {
	v := map[string]*prims{"best (" + best.name + ")": best}
	for name, p := range extraPrims() {
		v[name] = p
	}
	return v
}

// halfPatterns returns float32 bit patterns that stress the rounding:
// every exponent with mantissas at and around the bf16 and f16 rounding
// points, subnormals, zeros, infinities and NaNs of every kind, and random
// bits.
func halfPatterns() []uint32 {
	var out []uint32
	for e := uint32(0); e < 256; e++ {
		for _, m := range []uint32{0, 1, 2, 0x7fff, 0x8000, 0x8001, 0x18000, 0xffff, 0x10000, 0xfff, 0x1000, 0x1001, 0x3000, 0x2fff, 0x3001,
			0x400000, 0x7fffff, 0x7f8000, 0x7fe000, 0x7fefff, 0x7ff000, 0x7ff001, 0x0fff, 0x2000, 0x5a5a5a} {
			out = append(out, e<<23|m, 1<<31|e<<23|m)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1 << 16 {
		out = append(out, r.Uint32())
	}
	return out
}

// TestConversionsSameBits: every conversion of every variant gives the
// Go code's bits (compute/half's) on all 65536 half patterns and on
// halfPatterns, at lengths that exercise the vector body and the tail.
func TestConversionsSameBits(t *testing.T) {
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	pats := halfPatterns()
	src := make([]float32, len(pats))
	for i, b := range pats {
		src[i] = math.Float32frombits(b)
	}
	for name, p := range primVariants() {
		for _, n := range []int{len(all), 17, 15, 1} {
			in := all[len(all)-n:]
			a, b := make([]float32, n), make([]float32, n)
			p.fromBF16(a, in)
			goPrims.fromBF16(b, in)
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
					t.Fatalf("%s fromBF16(%#04x) = %#08x, want %#08x", name, in[i], math.Float32bits(a[i]), math.Float32bits(b[i]))
				}
			}
			p.fromF16(a, in)
			goPrims.fromF16(b, in)
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
					t.Fatalf("%s fromF16(%#04x) = %#08x, want %#08x", name, in[i], math.Float32bits(a[i]), math.Float32bits(b[i]))
				}
			}
		}
		for _, n := range []int{len(src), 33, 16, 3} {
			in := src[len(src)-n:]
			a, b := make([]uint16, n), make([]uint16, n)
			p.toBF16(a, in)
			goPrims.toBF16(b, in)
			for i := range a {
				if a[i] != b[i] {
					t.Fatalf("%s toBF16(%#08x) = %#04x, want %#04x", name, math.Float32bits(in[i]), a[i], b[i])
				}
			}
			p.toF16(a, in)
			goPrims.toF16(b, in)
			for i := range a {
				if a[i] != b[i] {
					t.Fatalf("%s toF16(%#08x) = %#04x, want %#04x", name, math.Float32bits(in[i]), a[i], b[i])
				}
			}
		}
	}
}
