package cpu

import (
	"context"
	"math"
	"runtime"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

func bitsEq(t *testing.T, what string, a, b []float32) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: lengths %d, %d", what, len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("%s[%d]: %g vs %g", what, i, a[i], b[i])
		}
	}
}

// TestPrimsSameBits runs every primitive of best (AVX2 where present) and
// of the pure-Go fallback on random rows of awkward lengths and demands
// identical bits.
func TestPrimsSameBits(t *testing.T) {
	if best == goPrims {
		t.Logf("no vector primitives on this CPU (%s); comparing Go with itself", runtime.GOARCH)
	}
	for _, n := range []int{1, 3, 7, 8, 9, 31, 32, 33, 63, 64, 257, 1000, 4096, 4097, 5120} {
		x := computetest.Uniform(uint64(n), n, 3)
		dy := computetest.Uniform(uint64(n)+1, n, 0.5)
		w := computetest.Uniform(uint64(n)+2, n, 1)
		r, c := float32(0.731), float32(-0.0123)
		if a, b := best.rowSumSq(x, new(scratch)), goPrims.rowSumSq(x, new(scratch)); math.Float32bits(a) != math.Float32bits(b) {
			t.Fatalf("n=%d rowSumSq: %g vs %g", n, a, b)
		}
		ss1, s1 := best.rowDots(x, dy, w, new(scratch))
		ss2, s2 := goPrims.rowDots(x, dy, w, new(scratch))
		if math.Float32bits(ss1) != math.Float32bits(ss2) || math.Float32bits(s1) != math.Float32bits(s2) {
			t.Fatalf("n=%d rowDots: (%g, %g) vs (%g, %g)", n, ss1, s1, ss2, s2)
		}
		if ss1 != best.rowSumSq(x, new(scratch)) {
			t.Fatalf("n=%d: rowDots' sum of squares differs from rowSumSq's", n)
		}
		for _, nt := range []bool{false, true} {
			dx1, dx2 := make([]float32, n), make([]float32, n)
			best.dx(x, dy, w, dx1, r, c, nt)
			goPrims.dx(x, dy, w, dx2, r, c, nt)
			bitsEq(t, "dx", dx1, dx2)
			p1, p2 := computetest.Uniform(9, n, 1), computetest.Uniform(9, n, 1)
			dx3 := make([]float32, n)
			best.dxdw(x, dy, w, dx3, p1, r, c, nt)
			goPrims.dxdw(x, dy, w, dx2, p2, r, c, nt)
			bitsEq(t, "dxdw dx", dx3, dx2)
			bitsEq(t, "dxdw p", p1, p2)
			bitsEq(t, "dxdw dx vs dx", dx3, dx1)
			q := computetest.Uniform(9, n, 1)
			best.dw(x, dy, q, r)
			bitsEq(t, "dw vs dxdw", q, p1)
		}
	}
}

// TestFusedSameBits: the fused RMSInv+DX+DW row kernel, the unfused
// kernels, the scalar and vector primitives and several thread counts all
// give the same bits, including a shape with many dw row blocks.
func TestFusedSameBits(t *testing.T) {
	jobs := []computetest.Job{
		computetest.NewJob(1, 300, 4097), // 10 row blocks, odd dim
		computetest.NewJob(2, 7, 33),
		computetest.NewJob(3, 1, 1),
		computetest.NewJob(4, 2048, 1024), // dx over ntBytes: streaming stores
		// Half dtypes: widened rows, dx rounded from scratch, dw rounded
		// by the reduction (one block and many).
		computetest.NewJob(5, 300, 4097).WithMix(computetest.Mix{X: compute.BF16, W: compute.BF16, DY: compute.BF16, DX: compute.BF16, DW: compute.BF16}),
		computetest.NewJob(6, 7, 33).WithMix(computetest.Mix{X: compute.F16, W: compute.F32, DY: compute.BF16, DX: compute.F32, DW: compute.F16}),
		computetest.NewJob(7, 2048, 1024).WithMix(computetest.Mix{X: compute.BF16, W: compute.F32, DY: compute.BF16, DX: compute.F16, DW: compute.F32}),
	}
	ctx := context.Background()
	ref, err := computetest.RunJobs(ctx, New(), jobs, computetest.DXThenDW)
	if err != nil {
		t.Fatal(err)
	}
	for i, j := range jobs {
		if err := j.Check(ref[i]); err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
	}
	variants := map[string]*Backend{
		"unfused":        {pr: best, noFuse: true},
		"scalar":         {pr: goPrims},
		"scalar-unfused": {pr: goPrims, noFuse: true},
		"1 thread":       {pr: best, threads: 1},
		"7 threads":      {pr: best, threads: 7},
	}
	for name, b := range variants {
		got, err := computetest.RunJobs(ctx, b, jobs, computetest.Reversed)
		if err != nil {
			t.Fatal(err)
		}
		for i := range jobs {
			if d := computetest.BitsEqual(got[i], ref[i]); d != "" {
				t.Fatalf("%s: job %d: %s", name, i, d)
			}
		}
	}
	// Each kernel in its own phase (RMSInv | DX | DW): the DX fuses with
	// RMSInv, the DW then reads r from memory.
	b := New()
	j := jobs[0]
	bufs := make([]compute.Buffer, 6)
	shapes := [][]int{{j.Rows, j.Dim}, {j.Dim}, {j.Rows, j.Dim}, {j.Rows}, {j.Rows, j.Dim}, {j.Dim}}
	for i, sh := range shapes {
		if bufs[i], err = b.Alloc(compute.F32, sh...); err != nil {
			t.Fatal(err)
		}
	}
	copy(bufs[0].Float32s(), j.X)
	copy(bufs[1].Float32s(), j.W)
	copy(bufs[2].Float32s(), j.DY)
	cb := compute.NewCommandBuffer(b)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cb.RMSInv(bufs[0], bufs[3], compute.RMSInvParams(j.Eps, j.Dim), j.Rows, j.Dim))
	cb.Barrier()
	must(cb.DX(bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], compute.DXParams(j.Dim, j.Eps), j.Rows, j.Dim))
	cb.Barrier()
	must(cb.DW(bufs[0], bufs[2], bufs[3], bufs[5], compute.DWParams(j.Dim, j.Rows), j.Rows, j.Dim))
	if _, err := cb.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	bitsEq(t, "3-phase r", bufs[3].Float32s(), ref[0].R)
	bitsEq(t, "3-phase dx", bufs[4].Float32s(), ref[0].DX)
	bitsEq(t, "3-phase dw", bufs[5].Float32s(), ref[0].DW)
}

func TestFusable(t *testing.T) {
	b := New()
	buf := func(n int) compute.Buffer { x, _ := b.Alloc(compute.F32, n); return x }
	x, w, dy, r, dx, dw, dy2 := buf(6), buf(3), buf(6), buf(2), buf(6), buf(3), buf(6)
	inv := compute.Op{Kind: compute.OpRMSInv, X: x, R: r}
	opDX := compute.Op{Kind: compute.OpDX, X: x, W: w, DY: dy, R: r, DX: dx}
	opDW := compute.Op{Kind: compute.OpDW, X: x, DY: dy, R: r, DW: dw}
	for _, c := range []struct {
		name     string
		next     []compute.Op
		ok       bool
		dxi, dwi int
	}{
		{"both", []compute.Op{opDX, opDW}, true, 0, 1},
		{"dx only", []compute.Op{opDX}, true, 0, -1},
		{"dw only", []compute.Op{{Kind: compute.OpDW, X: x, DY: dy, R: r, DW: dw}}, true, -1, 0},
		{"other reader of r", []compute.Op{opDX, opDW, {Kind: compute.OpDW, X: dy2, DY: dy, R: r, DW: buf(3)}}, false, -1, -1},
		{"dy disagrees", []compute.Op{opDX, {Kind: compute.OpDW, X: x, DY: dy2, R: r, DW: dw}}, false, -1, -1},
		{"no reader", []compute.Op{{Kind: compute.OpRMSInv, X: dy2, R: buf(2)}}, false, -1, -1},
	} {
		var users []int
		for i, o := range c.next {
			if o.X == r || o.W == r || o.DY == r || o.R == r || o.DX == r || o.DW == r {
				users = append(users, i)
			}
		}
		dxi, dwi, ok := compute.Fusable(&inv, c.next, users)
		if ok != c.ok || (ok && (dxi != c.dxi || dwi != c.dwi)) {
			t.Errorf("%s: fusable = %d, %d, %v; want %d, %d, %v", c.name, dxi, dwi, ok, c.dxi, c.dwi, c.ok)
		}
	}
}

func TestExecuteForeignBufferAndCancel(t *testing.T) {
	a, b := New(), New()
	x, _ := a.Alloc(compute.F32, 2, 4)
	r, _ := b.Alloc(compute.F32, 2)
	cb := compute.NewCommandBuffer(b)
	if err := cb.RMSInv(x, r, compute.RMSInvParams(1e-5, 4), 2, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Commit(context.Background()); err == nil {
		t.Fatal("a buffer of another backend was accepted")
	}
	j := computetest.NewJob(5, 4096, 256)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := computetest.RunJobs(ctx, b, []computetest.Job{j}, computetest.DXThenDW); err == nil {
		t.Fatal("cancelled context: no error")
	}
}

// TestPoolReuse: steady state allocates no tensor memory.
func TestPoolReuse(t *testing.T) {
	b := New()
	j := computetest.NewJob(6, 64, 4096)
	ctx := context.Background()
	if _, err := computetest.RunJob(ctx, b, j); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(5, func() {
		buf, _ := b.Alloc(compute.F32, 64, 4096)
		buf.Release()
	})
	if allocs > 3 {
		t.Fatalf("Alloc+Release of a pooled size: %v allocations", allocs)
	}
	var ms1, ms2 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	for range 5 {
		if _, err := computetest.RunJob(ctx, b, j); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&ms2)
	// RunJob itself copies the three outputs out (3.1 MB per run); the
	// backend must add no tensor-sized allocation on top.
	perRun := (ms2.TotalAlloc - ms1.TotalAlloc) / 5
	copies := uint64(4 * (2*64*4096 + 64 + 4096))
	if perRun > copies+copies/4 {
		t.Fatalf("%d bytes allocated per run, want about the %d RunJob copies out", perRun, copies)
	}
	if sizeClass(1000) < 1000 || sizeClass(1000) > 1000+1000/8 || sizeClass(64*4096) != 64*4096 {
		t.Fatalf("sizeClass: %d, %d", sizeClass(1000), sizeClass(64*4096))
	}
}
