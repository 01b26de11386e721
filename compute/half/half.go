// Package half converts between float32 and the two 16-bit floating-point
// formats rmsgrad computes with: bfloat16 (BF16: 1 sign, 8 exponent, 7
// mantissa bits, float32's range) and IEEE 754 binary16 (F16: 1 sign, 5
// exponent, 10 mantissa bits, largest finite 65504). Every Go layer uses
// it (the cpu backend's portable path, the conformance suite's oracle, the
// job generator, the tests), so they all agree on every bit.
//
// Conversions:
//   - BF16 and F16 to float32 are exact (every half value is a float32).
//     A NaN stays NaN with its payload; F16's is quieted (the float32
//     mantissa's top bit set), as the x86 F16C instruction VCVTPH2PS does.
//   - float32 to BF16 and F16 round to nearest, ties to even, subnormals
//     included; a value past the largest finite one becomes ±Inf (what
//     IEEE rounding gives; the worker's non-finite output check then fails
//     the job). A NaN stays NaN: its top mantissa bits are kept and the
//     quiet bit set, as the x86 instructions VCVTNEPS2BF16 (AVX-512 BF16)
//     and VCVTPS2PH (F16C) do, so that vector code using them can give
//     exactly these bits.
//
// Round and ULP work on float64 for oracles: a float64 rounded once to the
// format (no double rounding through float32).
package half

import "math"

// BF16ToFloat32 returns the float32 with the bfloat16 bits h: exact, a
// shift.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBF16 rounds f to the nearest bfloat16 (ties to even) and returns
// its bits. Values whose rounding passes the largest finite bfloat16 become
// ±Inf; a NaN keeps its sign and top 7 mantissa bits and gets the quiet bit.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x0040
	}
	// Adding 0x7fff plus the lowest kept bit carries into the kept bits
	// exactly when the dropped half is over a half, or a half with the kept
	// part odd; the carry propagates into the exponent (and to Inf) as
	// rounding should.
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// F16ToFloat32 returns the float32 with the binary16 bits h: exact for
// every number; a NaN keeps its sign and payload and gets the quiet bit.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 0x1f
	m := uint32(h & 0x3ff)
	switch {
	case e == 0x1f && m == 0:
		return math.Float32frombits(sign | 0x7f800000)
	case e == 0x1f:
		return math.Float32frombits(sign | 0x7fc00000 | m<<13)
	case e == 0:
		// Zero or subnormal: m * 2^-24, exact in float32.
		v := float32(m) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (e+127-15)<<23 | m<<13)
}

// Float32ToF16 rounds f to the nearest binary16 (ties to even, subnormals
// included) and returns its bits. Values whose rounding passes 65504
// become ±Inf; a NaN keeps its sign and top 9 payload bits and gets the
// quiet bit.
func Float32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	if exp == 0 {
		return sign // float32 subnormals are far below half of F16's smallest subnormal
	}
	// f = M * 2^(exp-150) with M the 24-bit significand. The result's
	// quantum is 2^(e16-25) for a normal binary16 of biased exponent e16 and
	// 2^-24 for a subnormal one: M is shifted right by s and rounded.
	e16 := exp - 127 + 15
	if e16 >= 0x1f {
		return sign | 0x7c00
	}
	s := int32(13)
	if e16 <= 0 {
		s = 14 - e16
	}
	if s >= 25 {
		return sign // below half of the smallest subnormal (2^-25)
	}
	m := mant | 0x800000
	r := m >> s
	rem := m & (1<<s - 1)
	if half := uint32(1) << (s - 1); rem > half || rem == half && r&1 == 1 {
		r++
	}
	if e16 <= 0 {
		return sign | uint16(r) // a subnormal, or 0x400 (the smallest normal) after rounding up
	}
	// r includes the implicit bit (1024..2048): a carry out of the mantissa
	// moves into the exponent, and past the largest exponent to Inf.
	return sign | uint16(e16-1)<<10 + uint16(r)
}
