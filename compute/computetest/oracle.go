package computetest

import (
	"fmt"
	"math"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/half"
)

// SplitMix64 is a tiny deterministic generator (Steele, Lea, Flood 2014):
// the same seed gives the same stream on every platform and Go version,
// which math/rand does not promise.
type SplitMix64 struct{ s uint64 }

// NewSplitMix64 returns a generator seeded with seed.
func NewSplitMix64(seed uint64) *SplitMix64 { return &SplitMix64{s: seed} }

// Uint64 returns the next 64 random bits.
func (g *SplitMix64) Uint64() uint64 {
	g.s += 0x9e3779b97f4a7c15
	z := g.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Float32 returns a value uniform in [-1, 1), exact in float32 (24 bits).
func (g *SplitMix64) Float32() float32 {
	return float32(int32(g.Uint64()>>40)-(1<<23)) / (1 << 23)
}

// Uniform returns n values uniform in [-scale, scale), a pure function of
// (seed, n, scale).
func Uniform(seed uint64, n int, scale float32) []float32 {
	g := NewSplitMix64(seed)
	v := make([]float32, n)
	for i := range v {
		v[i] = g.Float32() * scale
	}
	return v
}

// Oracle computes r[rows], dx[rows*dim] and dw[dim] in float64 from the
// float32 inputs, straight from the definitions in package compute's doc.
// It is the reference every backend is compared with.
func Oracle(x, w, dy []float32, rows, dim int, eps float64) (r, dx, dw []float64) {
	r = make([]float64, rows)
	dx = make([]float64, rows*dim)
	dw = make([]float64, dim)
	for b := 0; b < rows; b++ {
		xr, dyr := x[b*dim:(b+1)*dim], dy[b*dim:(b+1)*dim]
		var ss, s float64
		for i := range xr {
			xi := float64(xr[i])
			ss += xi * xi
			s += float64(dyr[i]) * xi * float64(w[i])
		}
		rb := 1 / math.Sqrt(ss/float64(dim)+eps)
		r[b] = rb
		c := s * rb * rb / float64(dim)
		for i := range xr {
			xi, dyi := float64(xr[i]), float64(dyr[i])
			if dim == 1 {
				// r*dy*w*(1 - x^2 r^2) = dy*w*eps*r^3 (compute.DXDim1),
				// without the cancellation even float64 would suffer.
				dx[b] = dyi * float64(w[0]) * eps * rb * rb * rb
			} else {
				dx[b*dim+i] = rb * (dyi*float64(w[i]) - xi*c)
			}
			dw[i] += dyi * xi * rb
		}
	}
	return r, dx, dw
}

// Tolerance returns the relative tolerance Compare allows for an output
// whose elements are sums of up to k float32 terms.
//
// Why this bound: each output is a float32 reduction of k products followed
// by a handful (< 8) of roundings (rsqrt, the r*(... - ...) of dx). A
// blocked or lane-split sum of k terms has a worst-case relative error of
// about log2(k)*u and a typical one of sqrt(k)*u (u = 2^-24), measured
// against the sum of |terms|; for the random inputs here that sum is within
// a small factor of max|output|. 8*u*sqrt(k) + 16*u covers the typical case
// with a wide margin (about 1.4e-5 at k = 8192), yet is far tighter than any
// real bug: dropping one of 8192 terms, a missing barrier or a wrong r
// moves outputs by 1e-4 to 1e0 of their scale.
func Tolerance(k int) float64 {
	const u = 1.0 / (1 << 24)
	return 8*u*math.Sqrt(float64(k)) + 16*u
}

// Compare checks got against the oracle's want normwise: every element must
// satisfy |got-want| <= Tolerance(max(rows, dim)) * max|want| (plus the
// float32 underflow floor). Normwise because the error of a sum scales with
// its terms, not with one small result. It returns an error naming the
// first offending index, or nil. For dx use CompareDX, whose scale is the
// size of dx's two terms, which partly cancel.
func Compare(name string, got []float32, want []float64, rows, dim int) error {
	scale := 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(v))
	}
	return CompareScale(name, got, want, scale, max(rows, dim))
}

// CompareDX checks dx against the oracle with the scale max|r*dy*w| and
// max|r*x*c| of its two terms (see Compare): when they partly cancel the
// rounding error of each term remains, so max|dx| alone would understate it.
// At dim 1 the backends compute dx without a difference
// (compute.DXDim1), so there dx is held to the plain normwise bound,
// Tolerance * max|dx|, like every other output.
func CompareDX(got []float32, want []float64, x, w, dy []float32, rows, dim int, eps float64) error {
	return CompareScale("dx", got, want, DXScale(x, w, dy, want, rows, dim, eps), max(rows, dim))
}

// DXScale is the scale CompareDX uses: the largest of dx's two terms,
// max|r*dy*w| and max|r*x*c|, over the whole tensor; at dim 1, where the
// backends compute dx without a difference, max|dx| (want, the oracle's
// dx).
func DXScale(x, w, dy []float32, want []float64, rows, dim int, eps float64) float64 {
	if dim == 1 {
		scale := 0.0
		for _, v := range want {
			scale = math.Max(scale, math.Abs(v))
		}
		return scale
	}
	r, _, _ := Oracle(x, w, dy, rows, dim, eps)
	scale := 0.0
	for b := 0; b < rows; b++ {
		var s float64
		for i := 0; i < dim; i++ {
			s += float64(dy[b*dim+i]) * float64(x[b*dim+i]) * float64(w[i])
		}
		c := s * r[b] * r[b] / float64(dim)
		for i := 0; i < dim; i++ {
			t1 := math.Abs(r[b] * float64(dy[b*dim+i]) * float64(w[i]))
			t2 := math.Abs(r[b] * float64(x[b*dim+i]) * c)
			scale = math.Max(scale, math.Max(t1, t2))
		}
	}
	return scale
}

func maxAbs(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, math.Abs(x))
	}
	return m
}

// CompareRounded checks an output of dtype dt against the oracle's want:
// for F32 it is CompareScale; for a half dtype every element must satisfy
//
//	|got - round(want)| <= ULP(max(|got|, |round(want)|)) + Tolerance(k)*scale
//
// with round and ULP those of dt (compute/half: Format.Round, Format.ULP).
//
// Why this bound: the backend computes the output in float32 (v32, within
// e32 = Tolerance(k)*scale of the exact v, as Compare argues), then rounds
// it once: |got - v32| <= ULP(got)/2. The oracle's value rounded to dt is
// within ULP(round(want))/2 of v. So |got - round(want)| <= e32 plus the
// two half-ULPs, at most the larger ULP plus e32. Away from cancellation
// e32 is far below one ULP of the half dtype (2^-8 relative for BF16,
// 2^-11 for F16, against e32 ~ 1e-5 of the scale), so got is round(want)
// or one of its two neighbours: one rounding of the output dtype. Where
// the result cancels (an output far below the scale of its terms, e.g. dx
// at dim 1) the float32 error e32 dominates, as it does for F32 outputs.
// A wrong formula, a dropped term, a dtype read as another or a
// half-precision accumulation moves results by many ULPs and fails; a
// wrong rounding of an otherwise right float32 result is caught exactly
// by CheckRoundedOnce instead.
func CompareRounded(name string, dt compute.DType, got []float32, want []float64, scale float64, k int) error {
	var f half.Format
	switch dt {
	case compute.F32, "":
		return CompareScale(name, got, want, scale, k)
	case compute.BF16:
		f = half.BF16
	case compute.F16:
		f = half.F16
	default:
		return fmt.Errorf("%s: dtype %s is not computed", name, dt)
	}
	if len(got) != len(want) {
		return fmt.Errorf("%s: length %d, want %d", name, len(got), len(want))
	}
	e32 := Tolerance(k) * scale
	for i, g := range got {
		w := f.Round(want[i])
		if float64(g) == w {
			continue
		}
		d := math.Abs(float64(g) - w)
		tol := math.Max(f.ULP(float64(g)), f.ULP(w)) + e32
		if !(d <= tol) { // also catches NaN and a lone Inf
			return fmt.Errorf("%s (%s)[%d] = %g, want %g rounded to %s = %g (|diff| %.3g > tol %.3g = one ULP + %.3g * scale %.3g)",
				name, dt, i, g, want[i], dt, w, d, tol, Tolerance(k), scale)
		}
	}
	return nil
}

// CompareScale checks |got-want| <= Tolerance(k)*scale element-wise.
func CompareScale(name string, got []float32, want []float64, scale float64, k int) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: length %d, want %d", name, len(got), len(want))
	}
	tol := Tolerance(k)*scale + 1e-37
	for i, g := range got {
		d := math.Abs(float64(g) - want[i])
		if !(d <= tol) { // also catches NaN
			return fmt.Errorf("%s[%d] = %g, want %g (|diff| %.3g > tol %.3g = %.3g * scale %.3g)",
				name, i, g, want[i], d, tol, Tolerance(k), scale)
		}
	}
	return nil
}
