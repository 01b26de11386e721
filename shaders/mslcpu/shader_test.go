package mslcpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// parityShapes cover every branch of the kernels' geometry: rows
// threadgroups of 64 to 512 threads (1, 2 and 3 rounds of tg_sum2 at SIMD
// width 8), elements held in registers and streamed (dims over 8192), one
// row group (dw written directly) and many (partials and the reduce), the
// most groups (256), dims not a multiple of anything, dim 1.
var parityShapes = []struct{ rows, dim int }{
	{2, 32}, {8, 1024}, {1, 1}, {7, 3}, {3, 257}, {2, 4097}, {1, 5120}, {2, 8192}, {1000, 33}, {9, 100},
	{3, 9000}, {40, 9000}, {5000, 5}, {33, 1}, {64, 4096},
}

func TestShaderParity(t *testing.T) {
	b := testBackend(t, 0)
	for i, s := range parityShapes {
		j := newJob(s.rows, s.dim, uint64(i+1), 0.5)
		if err := runJobs(t, b, j); err != nil {
			t.Fatalf("%dx%d: %v", s.rows, s.dim, err)
		}
		if err := checkOracle(j); err != nil {
			t.Error(err)
		}
	}
}

// runShapes runs every parity shape, each in a command buffer of its own,
// and returns the jobs with their outputs.
func runShapes(t *testing.T, b compute.Backend) []*job {
	t.Helper()
	var out []*job
	for i, s := range parityShapes {
		j := newJob(s.rows, s.dim, uint64(200+i), 1)
		if err := runJobs(t, b, j); err != nil {
			t.Fatalf("%s: %dx%d: %v", b.DeviceName(), s.rows, s.dim, err)
		}
		out = append(out, j)
	}
	return out
}

// sameBits reports the first output that differs between two runs of the
// same jobs.
func sameBits(a, b []*job) error {
	for i := range a {
		x, y := a[i], b[i]
		for _, o := range []struct {
			name string
			u, v []float32
		}{{"r", x.r, y.r}, {"dx", x.dx, y.dx}, {"dw", x.dw, y.dw}} {
			for k := range o.u {
				if math.Float32bits(o.u[k]) != math.Float32bits(o.v[k]) {
					return fmt.Errorf("%dx%d: %s[%d] = %v vs %v", x.rows, x.dim, o.name, k, o.u[k], o.v[k])
				}
			}
		}
	}
	return nil
}

// The kernels give the same bits at every SIMD width a Mac GPU may run
// them with (Intel GPUs pick 8, 16 or 32 per pipeline, AMD GPUs 64, Apple
// silicon 32): the summation order is a tree over thread indices that the
// width does not change. Each width's outputs also pass the oracle.
func TestSimdWidths(t *testing.T) {
	ref := runShapes(t, testBackendWith(t, Options{SimdWidth: 32}))
	for _, w := range []int{8, 16, 64} {
		got := runShapes(t, testBackendWith(t, Options{SimdWidth: w}))
		for _, j := range got {
			if err := checkOracle(j); err != nil {
				t.Errorf("SIMD width %d: %v", w, err)
			}
		}
		if err := sameBits(ref, got); err != nil {
			t.Errorf("SIMD width %d differs from 32: %v", w, err)
		}
	}
}

// The driver switches fibers by its own assembly on x86-64 and by ucontext
// elsewhere (FIBER_UCONTEXT forces it): the two give the same bits, which
// pass the oracle.
func TestFiberSwitches(t *testing.T) {
	ref := runShapes(t, testBackend(t, 0))
	dir := filepath.Join(buildDir, "ucontext")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := Build(context.Background(), BuildOptions{Dir: dir, Flags: []string{"-DFIBER_UCONTEXT"}})
	skipNoCompiler(t, err)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(Options{Driver: d})
	if err != nil {
		t.Fatal(err)
	}
	got := runShapes(t, b)
	for _, j := range got {
		if err := checkOracle(j); err != nil {
			t.Errorf("ucontext: %v", err)
		}
	}
	if err := sameBits(ref, got); err != nil {
		t.Errorf("ucontext against the assembly switch: %v", err)
	}
}

// RMSInv, DX and DW fused into one rows dispatch give the same bits as the
// three dispatched apart (each a flag set of the same kernel).
func TestFusedSameBitsAsUnfused(t *testing.T) {
	fused := runShapes(t, testBackend(t, 0))
	apart := runShapes(t, testBackendWith(t, Options{NoFuse: true}))
	if err := sameBits(fused, apart); err != nil {
		t.Fatalf("fused vs unfused: %v", err)
	}
}

// A plan split into many command buffers (a huge job's groups spread over
// several, as DefaultMaxCommandBytes does for real) gives the same bits.
func TestCommandBufferSplit(t *testing.T) {
	whole := runShapes(t, testBackend(t, 0))
	split := runShapes(t, testBackendWith(t, Options{MaxCommandBytes: 64 << 10}))
	if err := sameBits(whole, split); err != nil {
		t.Fatalf("split plan: %v", err)
	}
}

// Outputs are bitwise the same for 1 and 2 driver threads and whether a job
// runs alone or inside a batch.
func TestShaderDeterminism(t *testing.T) {
	one, two := testBackend(t, 1), testBackend(t, 2)
	var alone []*job
	for i, s := range parityShapes {
		j := newJob(s.rows, s.dim, uint64(100+i), 1)
		if err := runJobs(t, one, j); err != nil {
			t.Fatal(err)
		}
		alone = append(alone, j)
	}
	var batch []*job
	for i := len(parityShapes) - 1; i >= 0; i-- {
		s := parityShapes[i]
		batch = append(batch, newJob(s.rows, s.dim, uint64(100+i), 1))
	}
	if err := runJobs(t, two, batch...); err != nil {
		t.Fatal(err)
	}
	for i, j := range alone {
		k := batch[len(batch)-1-i]
		if !slices.Equal(j.r, k.r) || !slices.Equal(j.dx, k.dx) || !slices.Equal(j.dw, k.dw) {
			t.Errorf("%dx%d: outputs differ between a 1-thread solo run and a 2-thread batch", j.rows, j.dim)
		}
	}
}

// A deliberately broken copy of a kernel must fail the parity check (or the
// driver's own checks): the checks above can fail.
func TestBrokenShaderIsCaught(t *testing.T) {
	cases := []struct {
		name, old, new string
		wantErr        string // a driver error; "" means the parity check must fail
		rows, dim      int    // 0: 1000x257 (62 row groups, 64 threads, 2 SIMD groups)
		opts           Options
	}{
		{
			name: "a round of the threadgroup sum drops its last partial",
			old:  "const bool have = idx < n;",
			new:  "const bool have = idx + 1u < n;",
		},
		{
			name: "the SIMD-group butterfly skips its first level",
			old:  "for (uint o = 1u; o < W; o <<= 1) {",
			new:  "for (uint o = 2u; o < W; o <<= 1) {",
		},
		{
			name: "missing barrier before a round reads the partials",
			old:  "        }\n        threadgroup_barrier(mem_flags::mem_threadgroup);\n        // Round:",
			new:  "        }\n        // Round:",
		},
		{
			name: "every row's sums share one half of the partials (no row parity)",
			old:  "            p ^= 1u;\n",
			new:  "",
			rows: 1000, dim: 513,
		},
		{
			name: "the dw reduce drops its last slice",
			old:  "for (uint k = 1u; k < RMS_RED_SLICES; ++k) {",
			new:  "for (uint k = 1u; k + 1u < RMS_RED_SLICES; ++k) {",
		},
		{
			name: "missing barrier in the dw reduce",
			old:  "    red[sl * RMS_RED_COLS + col] = a;\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n",
			new:  "    red[sl * RMS_RED_COLS + col] = a;\n",
		},
		{
			name: "a row group's partial is dropped",
			old:  "                store_elem(part, pbase + i, pt, dwacc[k]);",
			new:  "                if (grp + 1u != G) store_elem(part, pbase + i, pt, dwacc[k]);",
		},
		{
			name:    "an out-of-range row group",
			old:     "const uint grp = geom.group0 + tg;",
			new:     "const uint grp = geom.group0 + tg + 1u;",
			wantErr: "signal: segmentation fault",
		},
		{
			name: "the last row of a job is skipped",
			old:  "row < rows; row += G, ++b)",
			new:  "row + 1u < rows; row += G, ++b)",
		},
		{
			name: "streamed rows accumulate dw from a stale partial",
			old:  "const float a = b == 0u ? 0.0f : load_elem(part, pbase + i, pt);",
			new:  "const float a = load_elem(part, pbase + i, pt);",
			rows: 40, dim: 9000,
		},
		{
			name: "dx of dim 1 in the cancelling general form",
			old:  "    if (dim == 1u) {\n        return",
			new:  "    if (false) {\n        return",
			rows: 33, dim: 1,
		},
		{
			name:    "barrier in divergent control flow",
			old:     "            if (writeR && t == 0u) {\n                r[row] = rb;",
			new:     "            if (writeR && t == 0u) {\n                threadgroup_barrier(mem_flags::mem_threadgroup);\n                r[row] = rb;",
			wantErr: "divergent barrier",
		},
		{
			name:    "read past the end of x",
			old:     "const bool in = k < E && i < dim;",
			new:     "const bool in = k < E && i <= dim;",
			wantErr: "signal: segmentation fault",
		},
		{
			name:    "an unfused DW writes dx, which its flags leave unbound",
			old:     "                    if (doDX) {\n                        store_elem(dx, base + i, dxt, dx_elem(xs[k]",
			new:     "                    if (doDX || doDW) {\n                        store_elem(dx, base + i, dxt, dx_elem(xs[k]",
			wantErr: "signal: segmentation fault",
			opts:    Options{NoFuse: true},
		},
		{
			name:    "kernel argument moved to an unbound index",
			old:     "constant rms_geom&   geom     [[buffer(6)]],",
			new:     "constant rms_geom&   geom     [[buffer(9)]],",
			wantErr: "[[buffer(9)]] is not bound",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := brokenBackend(t, c.old, c.new, c.opts)
			rows, dim := c.rows, c.dim
			if rows == 0 {
				rows, dim = 1000, 257
			}
			j := newJob(rows, dim, 7, 1)
			err := runJobs(t, b, j)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || !errors.Is(err, compute.ErrDevice) {
					t.Fatalf("got error %v, want one containing %q and wrapping ErrDevice", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("driver failed: %v", err)
			}
			if err := checkOracle(j); err == nil {
				t.Fatal("the broken shader passed the parity check")
			} else {
				t.Logf("caught: %v", err)
			}
		})
	}
}

func TestExecuteHonoursContext(t *testing.T) {
	b := testBackend(t, 0)
	j := newJob(2, 32, 1, 1)
	j.alloc(t, b)
	cb := compute.NewCommandBuffer(b)
	if err := j.recordInv(cb); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := cb.Commit(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("commit with a cancelled context: %v, want context.Canceled", err)
	}
}

func TestParseKernels(t *testing.T) {
	src := `// kernel void not_me(int a [[buffer(0)]])
kernel void k1(device const float* a [[buffer(0)]], /* c */ constant float2& p [[ buffer( 2 ) ]],
    threadgroup float* s [[threadgroup(0)]], uint i [[thread_position_in_threadgroup]]) {}`
	d, err := parseKernels(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(d) != 1 || d[0].Name != "k1" || len(d[0].Params) != 4 {
		t.Fatalf("parsed %+v", d)
	}
	want := []kernelParam{
		{"device const float*", "a", "buffer(0)"},
		{"constant float2&", "p", "buffer(2)"},
		{"threadgroup float*", "s", "threadgroup(0)"},
		{"uint", "i", "thread_position_in_threadgroup"},
	}
	if !slices.Equal(d[0].Params, want) {
		t.Fatalf("params %+v, want %+v", d[0].Params, want)
	}
	if _, err := genGlue([]kernelDecl{{Name: "k", Params: []kernelParam{{"uint2", "i", "thread_position_in_grid"}}}}, "x.metal"); err == nil {
		t.Fatal("a vector built-in was accepted")
	}
	if _, err := genGlue([]kernelDecl{{Name: "k", Params: []kernelParam{{"uint", "i", "quad_lane_id"}}}}, "x.metal"); err == nil {
		t.Fatal("an unknown attribute was accepted")
	}
}

// halfJobs are jobs in every element type the kernels load and store,
// on shapes that take both the register and the streaming path.
func halfJobs() []computetest.Job {
	mixes := []computetest.Mix{
		{X: compute.BF16, W: compute.BF16, DY: compute.BF16},
		{X: compute.F16, W: compute.F32, DY: compute.F16},
		{X: compute.BF16, W: compute.F16, DY: compute.F32, DX: compute.F32, DW: compute.F32},
		{X: compute.F16, W: compute.BF16, DY: compute.BF16, DX: compute.BF16, DW: compute.F16},
	}
	var js []computetest.Job
	for i, sh := range [][2]int{{40, 257}, {3, 9000}, {33, 1}} {
		for k, m := range mixes {
			js = append(js, computetest.NewJob(uint64(900+10*i+k), sh[0], sh[1]).WithMix(m))
		}
	}
	return js
}

// Half-precision loads and stores give the same bits at every SIMD width
// too, and pass the oracle rounded to each output's dtype.
func TestSimdWidthsHalf(t *testing.T) {
	ctx := context.Background()
	var ref []computetest.Output
	for _, w := range []int{32, 8, 16, 64} {
		b := testBackendWith(t, Options{SimdWidth: w})
		for i, j := range halfJobs() {
			o, err := computetest.RunJob(ctx, b, j)
			if err != nil {
				t.Fatalf("width %d: %dx%d %s: %v", w, j.Rows, j.Dim, j.Mix, err)
			}
			if err := j.Check(o); err != nil {
				t.Errorf("width %d: %dx%d %s: %v", w, j.Rows, j.Dim, j.Mix, err)
			}
			if w == 32 {
				ref = append(ref, o)
			} else if !computetest.SameBits(ref[i], o) {
				t.Errorf("width %d: %dx%d %s: outputs differ from width 32", w, j.Rows, j.Dim, j.Mix)
			}
		}
	}
}

// Broken conversions in the shader are caught by the suite's checks: the
// oracle compares each half output with the float64 result rounded to its
// dtype, and each half output must be the float32 output rounded once.
// (Exact ties, which random data almost never hits, are
// TestShaderConversions' part.)
func TestBrokenHalfConversionIsCaught(t *testing.T) {
	cases := []struct{ name, old, new string }{
		{"bf16 stores truncate instead of rounding to nearest even", "    u += 0x7fffu + ((u >> 16) & 1u);\n", ""},
		{"f16 loads lose the subnormal exponent step", "            e -= 1u;\n", ""},
		{"bf16 loads read the wrong half of the word", "static inline float bf16_to_f32(ushort h) { return as_type<float>(uint(h) << 16); }", "static inline float bf16_to_f32(ushort h) { return as_type<float>(uint(h) << 15); }"},
	}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := brokenBackend(t, c.old, c.new, Options{})
			var caught error
			for _, j := range halfJobs() {
				if c.name == "f16 loads lose the subnormal exponent step" {
					// Subnormal f16 inputs: scale x down past 2^-14.
					for i := range j.X {
						j.X[i] *= 1e-5
					}
					j = j.WithMix(j.Mix)
				}
				o, err := computetest.RunJob(ctx, b, j)
				if err != nil {
					t.Fatal(err)
				}
				if caught = j.Check(o); caught != nil {
					break
				}
				// Within the oracle's bound a rounding mistake is off by one
				// unit in the last place: the half outputs must be the F32
				// outputs rounded once, bit for bit.
				f := j
				f.Mix.DX, f.Mix.DW = compute.F32, compute.F32
				ref, err := computetest.RunJob(ctx, b, f)
				if err != nil {
					t.Fatal(err)
				}
				if caught = computetest.CheckRoundedOnce(ref, o, j.Mix); caught != nil {
					break
				}
			}
			if caught == nil {
				t.Fatal("the broken conversion passed the oracle")
			}
			t.Logf("caught: %v", caught)
		})
	}
}
