package cpu

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/compute/half"
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

// halfFinite maps 2 bytes to half bits of a finite value (any exponent,
// subnormals included) of dtype dt.
func halfFinite(b []byte, dt compute.DType) uint16 {
	h := binary.LittleEndian.Uint16(b)
	exp := uint16(0x7f80)
	if dt == compute.F16 {
		exp = 0x7c00
	}
	if h&exp == exp {
		h &^= exp &^ (exp >> 1) // clear the exponent's top bit: finite
	}
	return h
}

// FuzzHalfSameBits: for arbitrary half bit patterns, the vector
// conversions give the Go code's bits (NaN and Inf included), and a job of
// any dtype mix over arbitrary finite half values computes the same bits
// on the vector and the scalar backend, fused and unfused.
func FuzzHalfSameBits(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef0123456789abcdef01"), uint8(0x3f), uint8(3))
	f.Add(make([]byte, 6*40), uint8(0), uint8(1))
	f.Add([]byte{0xff, 0x7f, 0x80, 0x7f, 0x01, 0x00, 0x00, 0x80, 0xff, 0xff, 0x00, 0x7c}, uint8(0x15), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, mixBits, rows uint8) {
		// Conversions on the raw bits.
		n := len(data) / 2
		raw := make([]uint16, n)
		for i := range raw {
			raw[i] = binary.LittleEndian.Uint16(data[2*i:])
		}
		for _, dt := range []compute.DType{compute.BF16, compute.F16} {
			a, b := make([]float32, n), make([]float32, n)
			best.widen(dt, a, raw)
			goPrims.widen(dt, b, raw)
			ha, hb := make([]uint16, n), make([]uint16, n)
			best.narrow(dt, ha, a)
			goPrims.narrow(dt, hb, a)
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) || ha[i] != hb[i] {
					t.Fatalf("%s %#04x: widen %#08x vs %#08x, narrow %#04x vs %#04x", dt, raw[i], math.Float32bits(a[i]), math.Float32bits(b[i]), ha[i], hb[i])
				}
			}
		}
		// A job: x, dy and w from the bytes, each of the mix's dtype.
		dts := compute.DTypes
		m := computetest.Mix{X: dts[mixBits%3], W: dts[mixBits/3%3], DY: dts[mixBits/9%3], DX: dts[mixBits/27%3], DW: dts[mixBits/81%3]}
		r := int(rows%4) + 1
		dim := len(data) / (6 * r)
		if dim == 0 {
			return
		}
		j := computetest.Job{Rows: r, Dim: dim, Eps: 1e-5, Mix: m}
		val := func(k int, dt compute.DType) float32 {
			b := data[2*k:]
			switch dt {
			case compute.BF16:
				return half.BF16ToFloat32(halfFinite(b, dt))
			case compute.F16:
				return half.F16ToFloat32(halfFinite(b, dt))
			}
			return float32(int16(binary.LittleEndian.Uint16(b))) / 4096
		}
		for i := range r * dim {
			j.X = append(j.X, val(i, m.X))
			j.DY = append(j.DY, val(r*dim+i, m.DY))
		}
		for i := range dim {
			j.W = append(j.W, val(2*r*dim+i, m.W))
		}
		ctx := context.Background()
		ref, err := computetest.RunJob(ctx, New(), j)
		if err != nil {
			t.Fatal(err)
		}
		for name, b := range map[string]*Backend{"scalar": New(Scalar()), "scalar-unfused": {pr: goPrims, noFuse: true}} {
			got, err := computetest.RunJob(ctx, b, j)
			if err != nil {
				t.Fatal(err)
			}
			if d := computetest.BitsEqual(got, ref); d != "" {
				t.Fatalf("%s, %dx%d %s: %s", name, r, dim, m, d)
			}
		}
	})
}
