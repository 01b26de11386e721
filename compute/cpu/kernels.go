package cpu

import (
	"math"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/half"
)

// lanes is the number of accumulators of every row sum (four AVX2 YMM
// registers of 8 floats). It fixes the summation order; see doc.go.
const lanes = 32

// prims are the row primitives. On amd64 with AVX2 (best) they are
// assembly; everywhere else, with the Scalar option and in tests, the Go
// versions below. Both give the same bits: sums keep the same 32 lanes,
// element-wise formulas do the same float32 operations in the same order,
// without FMA.
type prims struct {
	// sumSq adds x[i]*x[i] into acc[i%32]; len(x) is a multiple of 32.
	sumSq func(x []float32, acc *[lanes]float32)
	// dot adds x[i]*x[i] into ss[i%32] and (dy[i]*w[i])*x[i] into s[i%32];
	// the lengths are equal multiples of 32.
	dot func(x, dy, w []float32, ss, s *[lanes]float32)
	// dx writes dx[i] = (dy[i]*w[i] - x[i]*c) * r.
	// nt asks for non-temporal stores (large outputs: skips the
	// read-for-ownership a plain store pays); the values are the same.
	dx func(x, dy, w, dx []float32, r, c float32, nt bool)
	// dxdw does dx and p[i] += (dy[i]*x[i]) * r in one pass.
	dxdw func(x, dy, w, dx, p []float32, r, c float32, nt bool)
	// dw does p[i] += (dy[i]*x[i]) * r.
	dw func(x, dy, p []float32, r float32)
	// fromBF16 and fromF16 widen half bits to float32 (exact); toBF16 and
	// toF16 round float32 to half bits, to nearest even, with exactly the
	// bits of compute/half. Equal lengths.
	fromBF16, fromF16 func(dst []float32, src []uint16)
	toBF16, toF16     func(dst []uint16, src []float32)
	// name names the vector unit and conversion instructions, for
	// DeviceName.
	name string
}

var goPrims = &prims{sumSqLanesGo, dotLanesGo, dxRowGo, dxdwRowGo, dwRowGo,
	fromBF16Go, fromF16Go, toBF16Go, toF16Go, "go"}

// best is the fastest primitives this CPU runs; amd64's init replaces it.
var best = goPrims

func sumSqLanesGo(x []float32, acc *[lanes]float32) {
	for i := 0; i+lanes <= len(x); i += lanes {
		v := x[i : i+lanes : i+lanes]
		for l := range lanes {
			acc[l] += float32(v[l] * v[l])
		}
	}
}

func dotLanesGo(x, dy, w []float32, ss, s *[lanes]float32) {
	n := len(x)
	dy, w = dy[:n], w[:n]
	for i := 0; i+lanes <= n; i += lanes {
		xv, dv, wv := x[i:i+lanes:i+lanes], dy[i:i+lanes:i+lanes], w[i:i+lanes:i+lanes]
		for l := range lanes {
			ss[l] += float32(xv[l] * xv[l])
			s[l] += float32(float32(dv[l]*wv[l]) * xv[l])
		}
	}
}

func dxRowGo(x, dy, w, dx []float32, r, c float32, _ bool) {
	n := len(dx)
	x, dy, w = x[:n], dy[:n], w[:n]
	for i := range dx {
		t := float32(dy[i] * w[i])
		u := float32(x[i] * c)
		dx[i] = float32((t - u) * r)
	}
}

func dxdwRowGo(x, dy, w, dx, p []float32, r, c float32, _ bool) {
	n := len(dx)
	x, dy, w, p = x[:n], dy[:n], w[:n], p[:n]
	for i := range dx {
		t := float32(dy[i] * w[i])
		u := float32(x[i] * c)
		dx[i] = float32((t - u) * r)
		p[i] += float32(float32(dy[i]*x[i]) * r)
	}
}

func dwRowGo(x, dy, p []float32, r float32) {
	n := len(p)
	x, dy = x[:n], dy[:n]
	for i := range p {
		p[i] += float32(float32(dy[i]*x[i]) * r)
	}
}

// reduceLanes combines 32 lane accumulators in a fixed tree: lanes l, l+8,
// l+16, l+24 pairwise, then halves 8 -> 4 -> 2 -> 1 (the order a YMM
// horizontal sum takes).
func reduceLanes(a *[lanes]float32) float32 {
	var v [8]float32
	for k := range 8 {
		v[k] = (a[k] + a[8+k]) + (a[16+k] + a[24+k])
	}
	u0, u1, u2, u3 := v[0]+v[4], v[1]+v[5], v[2]+v[6], v[3]+v[7]
	return (u0 + u2) + (u1 + u3)
}

// scratch holds a row's lane accumulators and, for half dtypes, the row's
// widened x and dy and a float32 output row. The prims are called through
// function values, so accumulators on the stack would escape: two heap
// allocations per row. Each task runner owns one scratch instead, taken
// from the backend's pool.
type scratch struct {
	a, b     [lanes]float32
	x, dy, o []float32
}

// grow makes x, dy and o hold at least n float32s.
func (sc *scratch) grow(n int) {
	if cap(sc.x) < n {
		sc.x, sc.dy, sc.o = make([]float32, n), make([]float32, n), make([]float32, n)
	}
}

// rowSumSq returns sum x[i]^2 in the fixed lane order.
func (pr *prims) rowSumSq(x []float32, sc *scratch) float32 {
	acc := &sc.a
	clear(acc[:])
	n := len(x) &^ (lanes - 1)
	if n > 0 {
		pr.sumSq(x[:n], acc)
	}
	for i := n; i < len(x); i++ {
		acc[i-n] += float32(x[i] * x[i])
	}
	return reduceLanes(acc)
}

// rowDots returns sum x^2 and sum (dy*w)*x in the same lane order as
// rowSumSq, so the fused and unfused r are bitwise equal.
func (pr *prims) rowDots(x, dy, w []float32, sc *scratch) (ss, s float32) {
	a, b := &sc.a, &sc.b
	clear(a[:])
	clear(b[:])
	n := len(x) &^ (lanes - 1)
	if n > 0 {
		pr.dot(x[:n], dy[:n], w[:n], a, b)
	}
	for i := n; i < len(x); i++ {
		a[i-n] += float32(x[i] * x[i])
		b[i-n] += float32(float32(dy[i]*w[i]) * x[i])
	}
	return reduceLanes(a), reduceLanes(b)
}

// rmsInv is r = 1/sqrt(ss/dim + eps): the mean and the sum in float32, the
// square root and reciprocal in float64 rounded once to float32.
func rmsInv(ss float32, dim int, eps float32) float32 {
	return float32(1 / math.Sqrt(float64(ss/float32(dim)+eps)))
}

// dxCoef is c = s*r*r/dim, the factor of x in dx.
func dxCoef(s, r float32, dim int) float32 {
	return float32(float32(s*r)*r) / float32(dim)
}

func fromBF16Go(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, h := range src {
		dst[i] = half.BF16ToFloat32(h)
	}
}

func fromF16Go(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, h := range src {
		dst[i] = half.F16ToFloat32(h)
	}
}

func toBF16Go(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i, f := range src {
		dst[i] = half.Float32ToBF16(f)
	}
}

func toF16Go(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i, f := range src {
		dst[i] = half.Float32ToF16(f)
	}
}

// widen converts src, half bits of dtype dt, to float32 in dst.
func (pr *prims) widen(dt compute.DType, dst []float32, src []uint16) {
	if dt == compute.BF16 {
		pr.fromBF16(dst, src)
	} else {
		pr.fromF16(dst, src)
	}
}

// narrow rounds src to half bits of dtype dt in dst.
func (pr *prims) narrow(dt compute.DType, dst []uint16, src []float32) {
	if dt == compute.BF16 {
		pr.toBF16(dst, src)
	} else {
		pr.toF16(dst, src)
	}
}
