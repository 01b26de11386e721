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

var avx2Prims = &prims{sumSqA, dotA, dxA, dxdwA, dwA, "avx2"}

func init() {
	if cpu.X86.HasAVX2 {
		best = avx2Prims
	}
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
