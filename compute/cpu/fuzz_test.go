package cpu

import (
	"encoding/binary"
	"math"
	"testing"
)

// finite maps 4 bytes to a finite float32 of any exponent (subnormals and
// huge values included), so every NaN that arises is the default NaN of an
// invalid operation and both paths must produce its exact bits too.
func finite(b []byte) float32 {
	u := binary.LittleEndian.Uint32(b)
	if u&0x7f800000 == 0x7f800000 {
		u &^= 0x00800000
	}
	return math.Float32frombits(u)
}

// FuzzPrimsSameBits: the vector and Go primitives agree bit for bit on
// arbitrary finite rows of any length.
func FuzzPrimsSameBits(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef0123456789abcdef"), uint32(0x3f000000), uint32(0xbc000000))
	f.Add(make([]byte, 12*40), uint32(0x7f000000), uint32(1))
	f.Fuzz(func(t *testing.T, data []byte, rb, cb uint32) {
		n := len(data) / 12
		x, dy, w := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range n {
			x[i], dy[i], w[i] = finite(data[12*i:]), finite(data[12*i+4:]), finite(data[12*i+8:])
		}
		var rbuf, cbuf [4]byte
		binary.LittleEndian.PutUint32(rbuf[:], rb)
		binary.LittleEndian.PutUint32(cbuf[:], cb)
		r, c := finite(rbuf[:]), finite(cbuf[:])
		same := func(what string, a, b float32) {
			if math.Float32bits(a) != math.Float32bits(b) {
				t.Fatalf("n=%d %s: %g (%#x) vs %g (%#x)", n, what, a, math.Float32bits(a), b, math.Float32bits(b))
			}
		}
		same("rowSumSq", best.rowSumSq(x, new(scratch)), goPrims.rowSumSq(x, new(scratch)))
		ss1, s1 := best.rowDots(x, dy, w, new(scratch))
		ss2, s2 := goPrims.rowDots(x, dy, w, new(scratch))
		same("rowDots ss", ss1, ss2)
		same("rowDots s", s1, s2)
		if n == 0 {
			return
		}
		dx1, dx2 := make([]float32, n), make([]float32, n)
		p1, p2 := append([]float32(nil), w...), append([]float32(nil), w...)
		best.dxdw(x, dy, w, dx1, p1, r, c, false)
		goPrims.dxdw(x, dy, w, dx2, p2, r, c, false)
		for i := range n {
			same("dxdw dx", dx1[i], dx2[i])
			same("dxdw p", p1[i], p2[i])
		}
		best.dx(x, dy, w, dx1, r, c, false)
		q := append([]float32(nil), w...)
		best.dw(x, dy, q, r)
		for i := range n {
			same("dx", dx1[i], dx2[i])
			same("dw", q[i], p2[i])
		}
	})
}
