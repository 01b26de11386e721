//go:build amd64 && !purego

package cpu

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// Implemented in kernels_amd64.s. n is a multiple of 32 (sums) or 8.
//
//go:noescape
func sumSqAVX2(x *float32, n int, acc *[lanes]float32)

//go:noescape
func dotAVX2(x, dy, w *float32, n int, ss, s *[lanes]float32)

//go:noescape
func dxAVX2(x, dy, w, dx *float32, n int, r, c float32, nt bool)

//go:noescape
func dxdwAVX2(x, dy, w, dx, p *float32, n int, r, c float32, nt bool)

//go:noescape
func dwAVX2(x, dy, p *float32, n int, r float32)

// Conversions, in half_amd64.s; n is a multiple of 16 and > 0.
//
//go:noescape
func bf16ToF32AVX2(dst *float32, src *uint16, n int)

//go:noescape
func f16ToF32F16C(dst *float32, src *uint16, n int)

//go:noescape
func f32ToF16F16C(dst *uint16, src *float32, n int)

//go:noescape
func f32ToBF16AVX512(dst *uint16, src *float32, n int)

//go:noescape
func f32ToBF16AVX2(dst *uint16, src *float32, n int)

func init() { best = pickPrims(cpu.X86.HasAVX2, cpu.X86.HasF16C, hasAVX512BF16()) }

// hasAVX512BF16 reports what f32ToBF16AVX512 needs: AVX-512 F, BW (the
// word mask move) and BF16, with the OS saving the ZMM state (x/sys/cpu
// checks that before setting any AVX-512 flag).
func hasAVX512BF16() bool {
	return cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512BF16
}

// pickPrims returns the primitives for a CPU with the given features:
// the AVX2 arithmetic and bf16 widening, the F16C conversions of F16 and,
// for rounding to bf16, AVX-512 BF16's VCVTNEPS2BF16 or else AVX2 integer
// code. Without AVX2, or a conversion's instructions, the Go code.
func pickPrims(avx2, f16c, avx512bf16 bool) *prims {
	if !avx2 {
		return goPrims
	}
	p := &prims{sumSqA, dotA, dxA, dxdwA, dwA, fromBF16A, fromF16Go, toBF16A, toF16Go, "avx2"}
	if f16c {
		p.fromF16, p.toF16 = fromF16A, toF16A
		p.name += "+f16c"
	}
	if avx512bf16 {
		p.toBF16 = toBF16Z
		p.name += "+avx512bf16"
	}
	return p
}

func fromBF16A(dst []float32, src []uint16) {
	n := len(dst)
	src = src[:n]
	n16 := n &^ 15
	if n16 > 0 {
		bf16ToF32AVX2(&dst[0], &src[0], n16)
	}
	fromBF16Go(dst[n16:], src[n16:])
}

func fromF16A(dst []float32, src []uint16) {
	n := len(dst)
	src = src[:n]
	n16 := n &^ 15
	if n16 > 0 {
		f16ToF32F16C(&dst[0], &src[0], n16)
	}
	fromF16Go(dst[n16:], src[n16:])
}

func toF16A(dst []uint16, src []float32) {
	n := len(dst)
	src = src[:n]
	n16 := n &^ 15
	if n16 > 0 {
		f32ToF16F16C(&dst[0], &src[0], n16)
	}
	toF16Go(dst[n16:], src[n16:])
}

func toBF16A(dst []uint16, src []float32) {
	n := len(dst)
	src = src[:n]
	n16 := n &^ 15
	if n16 > 0 {
		f32ToBF16AVX2(&dst[0], &src[0], n16)
	}
	toBF16Go(dst[n16:], src[n16:])
}

func toBF16Z(dst []uint16, src []float32) {
	n := len(dst)
	src = src[:n]
	n16 := n &^ 15
	if n16 > 0 {
		f32ToBF16AVX512(&dst[0], &src[0], n16)
	}
	toBF16Go(dst[n16:], src[n16:])
}

func sumSqA(x []float32, acc *[lanes]float32) {
	if n := len(x) &^ (lanes - 1); n > 0 {
		sumSqAVX2(&x[0], n, acc)
	}
}

func dotA(x, dy, w []float32, ss, s *[lanes]float32) {
	n := len(x) &^ (lanes - 1)
	if n > 0 {
		dy, w = dy[:n], w[:n] // bounds check before the assembly reads
		dotAVX2(&x[0], &dy[0], &w[0], n, ss, s)
	}
}

// aligned32 reports whether v starts on a 32-byte boundary (VMOVNTPS
// needs it; unaligned rows use plain stores, same values).
func aligned32(v []float32) bool { return uintptr(unsafe.Pointer(&v[0]))&31 == 0 }

func dxA(x, dy, w, dx []float32, r, c float32, nt bool) {
	n := len(dx)
	x, dy, w = x[:n], dy[:n], w[:n]
	n8 := n &^ 7
	if n8 > 0 {
		dxAVX2(&x[0], &dy[0], &w[0], &dx[0], n8, r, c, nt && aligned32(dx))
	}
	dxRowGo(x[n8:], dy[n8:], w[n8:], dx[n8:], r, c, false)
}

func dxdwA(x, dy, w, dx, p []float32, r, c float32, nt bool) {
	n := len(dx)
	x, dy, w, p = x[:n], dy[:n], w[:n], p[:n]
	n8 := n &^ 7
	if n8 > 0 {
		dxdwAVX2(&x[0], &dy[0], &w[0], &dx[0], &p[0], n8, r, c, nt && aligned32(dx))
	}
	dxdwRowGo(x[n8:], dy[n8:], w[n8:], dx[n8:], p[n8:], r, c, false)
}

func dwA(x, dy, p []float32, r float32) {
	n := len(p)
	x, dy = x[:n], dy[:n]
	n8 := n &^ 7
	if n8 > 0 {
		dwAVX2(&x[0], &dy[0], &p[0], n8, r)
	}
	dwRowGo(x[n8:], dy[n8:], p[n8:], r)
}

// extraPrims returns, for tests, the narrower primitive sets pickPrims
// gives CPUs with fewer features than this one, that this one can run.
func extraPrims() map[string]*prims {
	m := map[string]*prims{}
	if cpu.X86.HasAVX2 {
		m["avx2"] = pickPrims(true, false, false)
		if cpu.X86.HasF16C {
			m["avx2+f16c"] = pickPrims(true, true, false)
		}
	}
	return m
}
