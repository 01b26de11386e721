package mslcpu

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/compute/half"
)

// convHarness calls the shader's own conversion functions (compiled from
// the .metal file against the shim) on the values it reads: mode, count,
// then count inputs; it writes one output per input.
const convHarness = `#include "metal_stdlib"
#include "rms_norm_backward.metal"
#include <cstdio>
namespace mslcpu {
unsigned g_simd_width = 32;
void sync_point(SyncKind) {}
const float* simd_exchange(float) { static float z[64]; return z; }
unsigned current_lane() { return 0; }
}
int main() {
    uint32_t mode, n;
    if (fread(&mode, 4, 1, stdin) != 1 || fread(&n, 4, 1, stdin) != 1) return 2;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v;
        if (fread(&v, 4, 1, stdin) != 1) return 2;
        uint32_t out = 0;
        switch (mode) {
        case 0: out = as_type<uint>(bf16_to_f32(ushort(v))); break;
        case 1: out = as_type<uint>(f16_to_f32(ushort(v))); break;
        case 2: out = f32_to_bf16(as_type<float>(v)); break;
        case 3: out = f32_to_f16(as_type<float>(v)); break;
        default: return 2;
        }
        fwrite(&out, 4, 1, stdout);
    }
    return 0;
}
`

// TestShaderConversions: the shader's bf16/f16 conversions, compiled from
// rms_norm_backward.metal, agree bit for bit with compute/half (which the
// CPU backend and the oracle use): every bf16 and f16 value widened, and
// float32 values narrowed around every rounding tie of every exponent
// (round to nearest even), subnormal results, overflow to Inf, signed
// zeros, Inf and NaN (payload kept quiet). Random data alone would almost
// never hit an exact tie.
func TestShaderConversions(t *testing.T) {
	gxx, err := exec.LookPath("g++")
	if err != nil {
		skipNoCompiler(t, ErrNoCompiler)
	}
	dir := t.TempDir()
	if _, err := Build(context.Background(), BuildOptions{Dir: dir}); err != nil {
		skipNoCompiler(t, err)
		t.Fatal(err)
	}
	src := filepath.Join(dir, "conv.cpp")
	if err := os.WriteFile(src, []byte(convHarness), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "conv")
	if out, err := exec.Command(gxx, "-std=c++17", "-O1", "-ffp-contract=off", "-Wno-attributes",
		"-I", filepath.Join(dir, "include"), "-I", dir, src, "-o", bin).CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	run := func(mode uint32, in []uint32) []uint32 {
		t.Helper()
		var req bytes.Buffer
		_ = binary.Write(&req, binary.LittleEndian, mode)
		_ = binary.Write(&req, binary.LittleEndian, uint32(len(in)))
		_ = binary.Write(&req, binary.LittleEndian, in)
		cmd := exec.Command(bin)
		cmd.Stdin = &req
		out, err := cmd.Output()
		if err != nil || len(out) != 4*len(in) {
			t.Fatalf("conversion harness mode %d: %v (%d bytes back)", mode, err, len(out))
		}
		res := make([]uint32, len(in))
		_ = binary.Read(bytes.NewReader(out), binary.LittleEndian, res)
		return res
	}

	all16 := make([]uint32, 1<<16)
	for i := range all16 {
		all16[i] = uint32(i)
	}
	for i, got := range run(0, all16) {
		if want := math.Float32bits(half.BF16ToFloat32(uint16(i))); got != want {
			t.Fatalf("bf16 %#04x widens to %#08x, compute/half %#08x", i, got, want)
		}
	}
	for i, got := range run(1, all16) {
		if want := math.Float32bits(half.F16ToFloat32(uint16(i))); got != want {
			t.Fatalf("f16 %#04x widens to %#08x, compute/half %#08x", i, got, want)
		}
	}

	// Narrowing inputs: for every exponent, values just below, at and just
	// above the ties of both formats (13 dropped bits for f16 normals, 16
	// for bf16; f16 subnormals drop more), odd and even kept bits, both
	// signs; the f16 overflow edge; specials; and random bits.
	var in []uint32
	for e := uint32(0); e < 256; e++ {
		for _, m := range []uint32{0, 1, 0x7fffff, 0x400000} {
			in = append(in, e<<23|m)
		}
		for _, kept := range []uint32{0, 1, 2, 3, 0x3ff} {
			for _, drop := range []uint32{13, 16} {
				tie := uint32(1) << (drop - 1)
				for _, d := range []int64{-1, 0, 1} {
					m := (kept<<drop | tie) + uint32(d)
					in = append(in, e<<23|m&0x7fffff)
				}
			}
		}
		for s := uint32(14); s <= 24; s++ { // f16 subnormal ties
			tie := uint32(1) << (s - 1)
			in = append(in, e<<23|(tie&0x7fffff), e<<23|((3*tie)&0x7fffff))
		}
	}
	in = append(in, 0x477fefff, 0x477ff000, 0x477ff001, 0x7f800000, 0x7fc00000, 0x7f800001, 0x7fbfffff, 0x33000000, 0x33000001, 0x32ffffff)
	g := computetest.NewSplitMix64(7)
	for range 20000 {
		in = append(in, uint32(g.Uint64()))
	}
	for _, v := range in[:len(in):len(in)] {
		in = append(in, v|0x80000000)
	}
	for i, got := range run(2, in) {
		if want := uint32(half.Float32ToBF16(math.Float32frombits(in[i]))); got != want {
			t.Fatalf("float32 %#08x narrows to bf16 %#04x, compute/half %#04x", in[i], got, want)
		}
	}
	for i, got := range run(3, in) {
		if want := uint32(half.Float32ToF16(math.Float32frombits(in[i]))); got != want {
			t.Fatalf("float32 %#08x narrows to f16 %#04x, compute/half %#04x", in[i], got, want)
		}
	}
	t.Logf("%d bf16 and %d f16 values widened, %d float32 values narrowed to each, bit for bit as compute/half", len(all16), len(all16), len(in))
}
