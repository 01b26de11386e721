package computetest

import "math"

func float32Bits(f float32) uint32     { return math.Float32bits(f) }
func float32FromBits(u uint32) float32 { return math.Float32frombits(u) }
