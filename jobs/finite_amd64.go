//go:build amd64 && !purego

package jobs

import (
	"golang.org/x/sys/cpu"

	"github.com/rmsgrad/rmsgrad/compute"
)

// hasAVX2 selects finiteAVX2; a variable so that tests can run the
// portable path on an AVX2 machine too.
var hasAVX2 = cpu.X86.HasAVX2

// finiteAVX2 reports whether the blocks*32 float32 values from p on are
// all finite: allFiniteSWAR's test on eight values per 256-bit register,
// four registers a step (finite_amd64.s). blocks must be > 0.
//
//go:noescape
func finiteAVX2(p *float32, blocks int) bool

// allFinite reports whether v holds no NaN or Inf. The worker scans every
// input and output of every job with it (about 100 KiB for a small job).
// BenchmarkCheckFinite on the development VM: 0.23 us per 32 KiB with
// AVX2, 1.4 us with allFiniteSWAR.
func allFinite(v []float32) bool {
	if hasAVX2 && len(v) >= 32 {
		n := len(v) / 32
		if !finiteAVX2(&v[0], n) {
			return false
		}
		v = v[32*n:]
	}
	return allFiniteSWAR(v)
}

// finite16AVX2 reports whether the blocks*64 half values from p on are all
// finite: allFinite16SWAR's test on sixteen values per 256-bit register,
// four registers a step (finite_amd64.s). blocks must be > 0.
//
//go:noescape
func finite16AVX2(p *uint16, blocks int, exp, one uint16) bool

// allFinite16 reports whether the BF16 or F16 values h hold no NaN or Inf.
func allFinite16(h []uint16, dt compute.DType) bool {
	exp, one := halfExp(dt)
	if hasAVX2 && len(h) >= 64 {
		n := len(h) / 64
		if !finite16AVX2(&h[0], n, exp, one) {
			return false
		}
		h = h[64*n:]
	}
	return allFinite16SWAR(h, exp, one)
}
