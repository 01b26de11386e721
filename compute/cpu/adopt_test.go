package cpu

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// TestAdopt: a buffer adopted over host bytes computes exactly what
// allocated copies compute, Release gives the bytes back once and never
// pools them, and unsuitable bytes are refused.
func TestAdopt(t *testing.T) {
	be := New()
	defer be.Close()
	const rows, dim = 5, 257
	host := func(n int, seed float64) []byte {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(math.Sin(seed+float64(i)))))
		}
		return b
	}
	xb, wb, dyb := host(rows*dim, 1), host(dim, 2), host(rows*dim, 3)
	released := map[string]int{}
	adopt := func(name string, b []byte, shape ...int) compute.Buffer {
		buf, ok := be.Adopt(compute.F32, shape, b, func() { released[name]++ })
		if !ok {
			t.Fatalf("Adopt(%s) refused", name)
		}
		return buf
	}
	alloc := func(src []byte, shape ...int) compute.Buffer {
		buf, err := be.Alloc(compute.F32, shape...)
		if err != nil {
			t.Fatal(err)
		}
		copy(buf.Bytes(), src)
		return buf
	}
	run := func(x, w, dy compute.Buffer) (dx, dw, r []float32) {
		rb, dxb, dwb := alloc(nil, rows), alloc(nil, rows, dim), alloc(nil, dim)
		defer rb.Release()
		defer dxb.Release()
		defer dwb.Release()
		cb := compute.NewCommandBuffer(be)
		if err := cb.RMSInv(x, rb, compute.RMSInvParams(1e-6, dim), rows, dim); err != nil {
			t.Fatal(err)
		}
		cb.Barrier()
		if err := cb.DX(x, w, dy, rb, dxb, compute.DXParams(dim, 1e-6), rows, dim); err != nil {
			t.Fatal(err)
		}
		if err := cb.DW(x, dy, rb, dwb, compute.DWParams(dim, rows), rows, dim); err != nil {
			t.Fatal(err)
		}
		if _, err := cb.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		return slices.Clone(dxb.Float32s()), slices.Clone(dwb.Float32s()), slices.Clone(rb.Float32s())
	}
	ax, aw, ady := adopt("x", xb, rows, dim), adopt("w", wb, dim), adopt("dy", dyb, rows, dim)
	cx, cw, cdy := alloc(xb, rows, dim), alloc(wb, dim), alloc(dyb, rows, dim)
	dx1, dw1, r1 := run(ax, aw, ady)
	dx2, dw2, r2 := run(cx, cw, cdy)
	same := func(what string, a, b []float32) {
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("%s[%d]: adopted %v, allocated %v", what, i, a[i], b[i])
			}
		}
	}
	same("dx", dx1, dx2)
	same("dw", dw1, dw2)
	same("r", r1, r2)
	if &ax.Bytes()[0] != &xb[0] {
		t.Fatal("the adopted buffer is not the host bytes")
	}
	be.pool.mu.Lock()
	retained := be.pool.retained
	be.pool.mu.Unlock()
	for _, b := range []compute.Buffer{ax, aw, ady, ax} { // x twice: a second Release is a no-op
		b.Release()
	}
	if released["x"] != 1 || released["w"] != 1 || released["dy"] != 1 {
		t.Fatalf("release calls %v, want one each", released)
	}
	be.pool.mu.Lock()
	grew := be.pool.retained != retained
	be.pool.mu.Unlock()
	if grew {
		t.Fatal("releasing adopted buffers put host memory into the pool")
	}
	for _, c := range []struct {
		name  string
		dt    compute.DType
		b     []byte
		shape []int
	}{
		{"wrong size", compute.F32, xb[:4*dim-4], []int{dim}},
		{"unaligned", compute.F32, xb[1 : 1+4*dim], []int{dim}},
		{"not computed", compute.DType("F64"), xb[:8*dim], []int{dim}},
		{"half unaligned", compute.BF16, xb[1 : 1+2*dim], []int{dim}},
		{"half wrong size", compute.F16, xb[:4*dim], []int{dim}},
		{"empty", compute.F32, nil, []int{0}},
	} {
		if _, ok := be.Adopt(c.dt, c.shape, c.b, func() { t.Fatalf("%s: release called", c.name) }); ok {
			t.Fatalf("Adopt accepted %s", c.name)
		}
	}
}

// TestAdoptHalf: BF16 and F16 host bytes adopted as buffers compute what
// allocated copies compute, and Release hands them back.
func TestAdoptHalf(t *testing.T) {
	be := New()
	defer be.Close()
	j := computetest.NewJob(7, 5, 257).WithMix(computetest.Mix{X: compute.BF16, W: compute.F16, DY: compute.BF16, DX: compute.BF16, DW: compute.F16})
	ref, err := computetest.RunJob(context.Background(), be, j)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(dt compute.DType, v []float32) []byte {
		b := make([]byte, 2*len(v))
		dt.Encode(b, v)
		return b
	}
	released := 0
	adopt := func(dt compute.DType, v []float32, shape ...int) compute.Buffer {
		buf, ok := be.Adopt(dt, shape, enc(dt, v), func() { released++ })
		if !ok {
			t.Fatalf("Adopt(%s) refused", dt)
		}
		return buf
	}
	x, w, dy := adopt(compute.BF16, j.X, j.Rows, j.Dim), adopt(compute.F16, j.W, j.Dim), adopt(compute.BF16, j.DY, j.Rows, j.Dim)
	alloc := func(dt compute.DType, shape ...int) compute.Buffer {
		b, err := be.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	r, dx, dw := alloc(compute.F32, j.Rows), alloc(compute.BF16, j.Rows, j.Dim), alloc(compute.F16, j.Dim)
	cb := compute.NewCommandBuffer(be)
	for _, err := range []error{
		cb.RMSInv(x, r, compute.RMSInvParams(j.Eps, j.Dim), j.Rows, j.Dim),
		func() error { cb.Barrier(); return nil }(),
		cb.DX(x, w, dy, r, dx, compute.DXParams(j.Dim, j.Eps), j.Rows, j.Dim),
		cb.DW(x, dy, r, dw, compute.DWParams(j.Dim, j.Rows), j.Rows, j.Dim),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cb.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := computetest.Output{R: computetest.Read(r), DX: computetest.Read(dx), DW: computetest.Read(dw)}
	if d := computetest.BitsEqual(got, ref); d != "" {
		t.Fatalf("adopted half inputs: %s", d)
	}
	for _, b := range []compute.Buffer{x, w, dy, r, dx, dw} {
		b.Release()
	}
	if released != 3 {
		t.Fatalf("%d release calls, want 3", released)
	}
}
