package computetest

import "math"

func float32Bits(f float32) uint32     { return math.Float32bits(f) }
func float32FromBits(u uint32) float32 { return math.Float32frombits(u) }

// SameBits reports whether two outputs are bitwise identical (NaNs
// included: bits, not values, are compared).
func SameBits(a, b Output) bool {
	for _, p := range [][2][]float32{{a.R, b.R}, {a.DX, b.DX}, {a.DW, b.DW}} {
		if len(p[0]) != len(p[1]) {
			return false
		}
		for i := range p[0] {
			if float32Bits(p[0][i]) != float32Bits(p[1][i]) {
				return false
			}
		}
	}
	return true
}
