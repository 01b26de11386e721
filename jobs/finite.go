package jobs

import (
	"encoding/binary"
	"unsafe"
)

// allFiniteSWAR reports whether v holds no NaN or Inf without a branch
// per value (checkFinite runs over every input and output of every job; the
// small-job profile had it as the worker's top function). An exponent of
// all ones plus one carries into bit 31 and no other exponent does, so
// OR-ing (bits & exponent mask) + (lowest exponent bit) over v leaves bit
// 31 clear exactly when every value is finite. It reads two values per
// 64-bit load (in native byte order, so each 32-bit lane is one value's
// bits), about twice the speed of the per-value loop.
func allFiniteSWAR(v []float32) bool {
	const exp2, one2 = 0x7f8000007f800000, 0x0080000000800000
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
	var a0, a1, a2, a3 uint64
	for len(b) >= 32 {
		a0 |= binary.NativeEndian.Uint64(b[0:])&exp2 + one2
		a1 |= binary.NativeEndian.Uint64(b[8:])&exp2 + one2
		a2 |= binary.NativeEndian.Uint64(b[16:])&exp2 + one2
		a3 |= binary.NativeEndian.Uint64(b[24:])&exp2 + one2
		b = b[32:]
	}
	for len(b) >= 4 {
		a0 |= uint64(binary.NativeEndian.Uint32(b)&0x7f800000 + 0x00800000)
		b = b[4:]
	}
	return (a0|a1|a2|a3)&0x8000000080000000 == 0
}
