package mslcpu

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

var parityShapes = []struct{ rows, dim int }{
	{2, 32}, {8, 1024}, {1, 1}, {7, 3}, {3, 257}, {2, 4097}, {1, 5120}, {2, 8192}, {1000, 33}, {9, 100},
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
	}{
		{
			name: "reduction drops the last simdgroup partial",
			old:  "float p = lane < nsg ? scratch[lane] : 0.0f;",
			new:  "float p = lane + 1 < nsg ? scratch[lane] : 0.0f;",
		},
		{
			name: "dw drops the last row lane",
			old:  "for (uint k = 1; k < nsg; ++k) {",
			new:  "for (uint k = 1; k + 1 < nsg; ++k) {",
		},
		{
			name: "simd tree skips a level",
			old:  "    v += simd_shuffle_down(v, 4u);\n",
			new:  "",
		},
		{
			name: "missing barrier before reading simdgroup partials",
			old:  "    threadgroup_barrier(mem_flags::mem_threadgroup);\n    float p =",
			new:  "    float p =",
		},
		{
			name:    "barrier in divergent control flow",
			old:     "    if (lid == 0) {\n        r[row] =",
			new:     "    if (lid == 0) {\n        threadgroup_barrier(mem_flags::mem_threadgroup);\n        r[row] =",
			wantErr: "divergent barrier",
		},
		{
			name:    "read past the end of x",
			old:     "for (uint i = lid; i < dim; i += tpg) {\n        acc = fma(xr[i], xr[i], acc);",
			new:     "for (uint i = lid; i <= dim; i += tpg) {\n        acc = fma(xr[i], xr[i], acc);",
			wantErr: "signal: segmentation fault",
		},
		{
			name:    "kernel argument moved to an unbound index",
			old:     "constant rms_geom&   geom     [[buffer(3)]],",
			new:     "constant rms_geom&   geom     [[buffer(9)]],",
			wantErr: "[[buffer(9)]] is not bound",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := brokenBackend(t, c.old, c.new)
			// 1000x257: several simdgroups per row, the last row ends at the
			// end of x, 8 row lanes in dw.
			j := newJob(1000, 257, 7, 0.5)
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
