package jobs

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
)

// halfExp returns the exponent mask of a half dtype and its lowest bit:
// (bits & exp) + one sets bit 15 exactly when the exponent is all ones
// (Inf or NaN), for BF16 (0x7f80, 0x0080) and F16 (0x7c00, 0x0400) alike.
func halfExp(dt compute.DType) (exp, one uint16) {
	if dt == compute.BF16 {
		return 0x7f80, 0x0080
	}
	return 0x7c00, 0x0400
}

// allFinite16SWAR reports whether the half values h (bits of BF16 or F16,
// as halfExp says) hold no NaN or Inf: allFiniteSWAR's test on four
// 16-bit lanes per 64-bit load (no carry crosses a lane: the largest sum
// is 0x8000).
func allFinite16SWAR(h []uint16, exp, one uint16) bool {
	e4, o4 := uint64(exp)*0x0001000100010001, uint64(one)*0x0001000100010001
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(h))), 2*len(h))
	var a0, a1, a2, a3 uint64
	for len(b) >= 32 {
		a0 |= binary.NativeEndian.Uint64(b[0:])&e4 + o4
		a1 |= binary.NativeEndian.Uint64(b[8:])&e4 + o4
		a2 |= binary.NativeEndian.Uint64(b[16:])&e4 + o4
		a3 |= binary.NativeEndian.Uint64(b[24:])&e4 + o4
		b = b[32:]
	}
	for len(b) >= 2 {
		a0 |= uint64(binary.NativeEndian.Uint16(b)&exp + one)
		b = b[2:]
	}
	return (a0|a1|a2|a3)&0x8000800080008000 == 0
}

// checkFiniteBuf is checkFinite for a buffer of any computed dtype.
func checkFiniteBuf(b compute.Buffer) error {
	dt := b.DType()
	if dt == compute.F32 {
		return checkFinite(b.Float32s())
	}
	data := b.Bytes()
	if len(data) == 0 {
		return nil
	}
	return checkFinite16(dt, unsafe.Slice((*uint16)(unsafe.Pointer(&data[0])), len(data)/2))
}

// checkFinite16 returns an ErrNonFinite error with the count and the first
// index of NaN/Inf values among the half values h of dtype dt, or nil.
func checkFinite16(dt compute.DType, h []uint16) error {
	exp, _ := halfExp(dt)
	if allFinite16(h, dt) {
		return nil
	}
	first, count := -1, 0
	for i, v := range h {
		if v&exp == exp {
			if first < 0 {
				first = i
			}
			count++
		}
	}
	if count == 0 {
		return nil
	}
	v := make([]float32, 1)
	dt.Decode(v, []byte{byte(h[first]), byte(h[first] >> 8)})
	return fmt.Errorf("%w: %d NaN/Inf of %d %s values, first at flat index %d (%v)", ErrNonFinite, count, len(h), dt, first, v[0])
}
