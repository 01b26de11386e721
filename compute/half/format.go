package half

import "math"

// Format describes a binary floating-point format by its precision and
// exponent range, for rounding float64 values to it exactly once.
type Format struct {
	// Name is the safetensors dtype name: "BF16", "F16".
	Name string
	// Precision is the significand's bits, the implicit one included.
	Precision int
	// MinExp and MaxExp bound the exponent e of normal values 1.f * 2^e.
	MinExp, MaxExp int
}

// The two half formats.
var (
	BF16 = Format{Name: "BF16", Precision: 8, MinExp: -126, MaxExp: 127}
	F16  = Format{Name: "F16", Precision: 11, MinExp: -14, MaxExp: 15}
)

// ULP returns the spacing of f's values at |v|: the distance from a value
// of v's binade to the next one up (the subnormal spacing below the normal
// range). Rounding v to f moves it by at most ULP(v)/2.
func (f Format) ULP(v float64) float64 {
	e := f.MinExp
	if v != 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
		_, exp := math.Frexp(v) // |v| = frac * 2^exp, frac in [0.5, 1)
		e = max(exp-1, f.MinExp)
	}
	return math.Ldexp(1, e-(f.Precision-1))
}

// Max returns the largest finite value of f.
func (f Format) Max() float64 {
	return math.Ldexp(2-math.Ldexp(1, 1-f.Precision), f.MaxExp)
}

// Round returns v rounded to the nearest value of f (ties to even), as a
// float64: ±Inf past the largest finite value (as IEEE rounding gives),
// NaN for NaN.
func (f Format) Round(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v == 0 {
		return v
	}
	q := f.ULP(v)
	// v/q and r*q only move the exponent: exact in float64.
	r := math.RoundToEven(v/q) * q
	if math.Abs(r) > f.Max() {
		return math.Copysign(math.Inf(1), v)
	}
	return r
}
