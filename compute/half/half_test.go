package half

import (
	"math"
	"testing"
)

// value16 is the exact value of a 16-bit pattern of a format with mbits
// stored mantissa bits and exponent bias, computed from the definition.
func value16(h uint16, mbits, ebits int) float64 {
	bias := 1<<(ebits-1) - 1
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>mbits) & (1<<ebits - 1)
	m := float64(int(h) & (1<<mbits - 1))
	switch e {
	case 1<<ebits - 1:
		if m == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	case 0:
		return sign * math.Ldexp(m, 1-bias-mbits)
	}
	return sign * math.Ldexp(1+m/float64(int(1)<<mbits), e-bias)
}

// TestToFloat32Exact: every one of the 65536 patterns of each format
// converts to its exact value (NaN to NaN), and back to itself.
func TestToFloat32Exact(t *testing.T) {
	for _, c := range []struct {
		name         string
		to           func(uint16) float32
		from         func(float32) uint16
		mbits, ebits int
	}{
		{"BF16", BF16ToFloat32, Float32ToBF16, 7, 8},
		{"F16", F16ToFloat32, Float32ToF16, 10, 5},
	} {
		for i := range 1 << 16 {
			h := uint16(i)
			want := value16(h, c.mbits, c.ebits)
			got := c.to(h)
			if math.IsNaN(want) {
				if !math.IsNaN(float64(got)) {
					t.Fatalf("%s %#04x: %v, want NaN", c.name, h, got)
				}
				continue
			}
			if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
				t.Fatalf("%s %#04x: %v, want %v", c.name, h, got, want)
			}
			if back := c.from(got); back != h {
				t.Fatalf("%s %#04x -> %v -> %#04x", c.name, h, got, back)
			}
		}
	}
}

// checkRound compares one float32's conversion with Format.Round of its
// (exact) float64 value: round to nearest even, done independently.
func checkRound(t *testing.T, f Format, conv func(float32) uint16, back func(uint16) float32, bits uint32) {
	x := math.Float32frombits(bits)
	h := conv(x)
	got := float64(back(h))
	if math.IsNaN(float64(x)) {
		if !math.IsNaN(got) {
			t.Fatalf("%s(%#08x NaN) = %#04x, not NaN", f.Name, bits, h)
		}
		return
	}
	want := f.Round(float64(x))
	if got != want || math.Signbit(got) != math.Signbit(float64(x)) {
		t.Fatalf("%s(%g, bits %#08x) = %#04x = %g, want %g", f.Name, x, bits, h, got, want)
	}
}

// TestFromFloat32RoundsToNearestEven checks the float32 -> half
// conversions against Format.Round on a stride through all float32 bit
// patterns and, for every pair of adjacent half values, at the float32s
// just below, on and just above their midpoint (the ties and near-ties).
func TestFromFloat32RoundsToNearestEven(t *testing.T) {
	stride := uint32(251)
	if testing.Short() {
		stride = 4093
	}
	for _, c := range []struct {
		f    Format
		conv func(float32) uint16
		back func(uint16) float32
	}{{BF16, Float32ToBF16, BF16ToFloat32}, {F16, Float32ToF16, F16ToFloat32}} {
		for b := uint64(0); b < 1<<32; b += uint64(stride) {
			checkRound(t, c.f, c.conv, c.back, uint32(b))
		}
		for i := range 1<<15 - 1 {
			lo, hi := float64(c.back(uint16(i))), float64(c.back(uint16(i+1)))
			if math.IsNaN(hi) || math.IsNaN(lo) {
				continue
			}
			if math.IsInf(hi, 0) {
				hi = lo + c.f.ULP(lo) // the overflow threshold's midpoint
			}
			mid := float32((lo + hi) / 2) // exact: at most 12 significant bits
			for _, s := range []float32{1, -1} {
				m := math.Float32bits(s * mid)
				for _, d := range []int32{-2, -1, 0, 1, 2} {
					checkRound(t, c.f, c.conv, c.back, uint32(int32(m)+d))
				}
			}
		}
	}
}

// TestNaN pins the NaN bits the vector instructions produce (see the
// package doc), and that no NaN becomes Inf: a float32 NaN whose payload
// sits only in the dropped low bits must stay NaN.
func TestNaN(t *testing.T) {
	for _, c := range []struct {
		in       uint32
		bf16, f6 uint16
	}{
		{0x7fc00000, 0x7fc0, 0x7e00},
		{0x7f800001, 0x7fc0, 0x7e00}, // signalling, payload only in low bits
		{0xff800001, 0xffc0, 0xfe00},
		{0x7fa00000, 0x7fe0, 0x7f00},
		{0x7fffffff, 0x7fff, 0x7fff},
	} {
		f := math.Float32frombits(c.in)
		if got := Float32ToBF16(f); got != c.bf16 {
			t.Errorf("Float32ToBF16(%#08x) = %#04x, want %#04x", c.in, got, c.bf16)
		}
		if got := Float32ToF16(f); got != c.f6 {
			t.Errorf("Float32ToF16(%#08x) = %#04x, want %#04x", c.in, got, c.f6)
		}
	}
	if got := math.Float32bits(F16ToFloat32(0x7c01)); got != 0x7fc02000 {
		t.Errorf("F16ToFloat32(0x7c01) = %#08x, want the quieted 0x7fc02000", got)
	}
	if got := math.Float32bits(BF16ToFloat32(0x7f81)); got != 0x7f810000 {
		t.Errorf("BF16ToFloat32(0x7f81) = %#08x, want 0x7f810000", got)
	}
}

func TestOverflowAndFormat(t *testing.T) {
	if F16.Max() != 65504 || BF16.Max() != float64(math.Float32frombits(0x7f7f0000)) {
		t.Fatalf("Max: F16 %v, BF16 %v", F16.Max(), BF16.Max())
	}
	for _, c := range []struct {
		f    float32
		want uint16
	}{{65504, 0x7bff}, {65519.99, 0x7bff}, {65520, 0x7c00}, {-1e6, 0xfc00}, {5.960464477539063e-08, 0x0001}, {2.99e-08, 0x0001}, {2.97e-08, 0x0000}, {2.9802322387695312e-08, 0x0000}} {
		if got := Float32ToF16(c.f); got != c.want {
			t.Errorf("Float32ToF16(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	if got := Float32ToBF16(math.MaxFloat32); got != 0x7f80 {
		t.Errorf("Float32ToBF16(MaxFloat32) = %#04x, want Inf 0x7f80", got)
	}
	if got := Float32ToBF16(math.Float32frombits(0x00000001)); got != 0 {
		t.Errorf("Float32ToBF16(smallest subnormal) = %#04x, want 0", got)
	}
	if got := Float32ToBF16(math.Float32frombits(0x00008001)); got != 1 {
		t.Errorf("Float32ToBF16(0x00008001) = %#04x, want the subnormal 1 (RNE, not flushed)", got)
	}
	if F16.ULP(1) != 1.0/1024 || BF16.ULP(1) != 1.0/128 || F16.ULP(1e-7) != math.Ldexp(1, -24) {
		t.Fatalf("ULP")
	}
	if F16.Round(65520) != math.Inf(1) || F16.Round(65519) != 65504 || BF16.Round(1+1.0/256) != 1 {
		t.Fatalf("Round")
	}
}

func TestSlices(t *testing.T) {
	v := []float32{1, -2.5, 3.14159, 1e-3}
	b := make([]byte, 2*len(v))
	out := make([]float32, len(v))
	EncodeBF16(b, v)
	DecodeBF16(out, b)
	for i := range v {
		if out[i] != BF16ToFloat32(Float32ToBF16(v[i])) || b[2*i+1] != byte(Float32ToBF16(v[i])>>8) {
			t.Fatalf("BF16 slice %d: %v", i, out[i])
		}
	}
	EncodeF16(b, v)
	DecodeF16(out, b)
	for i := range v {
		if out[i] != F16ToFloat32(Float32ToF16(v[i])) || b[2*i] != byte(Float32ToF16(v[i])) {
			t.Fatalf("F16 slice %d: %v", i, out[i])
		}
	}
}
