//go:build !amd64 || purego

package jobs

import "github.com/rmsgrad/rmsgrad/compute"

// allFinite reports whether v holds no NaN or Inf.
func allFinite(v []float32) bool { return allFiniteSWAR(v) }

// allFinite16 reports whether the BF16 or F16 values h hold no NaN or Inf.
func allFinite16(h []uint16, dt compute.DType) bool {
	exp, one := halfExp(dt)
	return allFinite16SWAR(h, exp, one)
}
