package cuda

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/shaders"
)

// fakeBackend records ops without a GPU, so the planner can be tested on
// any machine: its buffers are plain *buffer values the planner accepts.
type fakeBackend struct{ ops []compute.Op }

func (f *fakeBackend) Name() string       { return "fake" }
func (f *fakeBackend) DeviceName() string { return "fake" }
func (f *fakeBackend) Alloc(dtype compute.DType, shape ...int) (compute.Buffer, error) {
	return &buffer{dtype: dtype, shape: shape, n: compute.NumElements(shape)}, nil
}
func (f *fakeBackend) Close() error { return nil }
func (f *fakeBackend) Execute(_ context.Context, ops []compute.Op) (time.Duration, error) {
	f.ops = append([]compute.Op(nil), ops...)
	return 0, nil
}

type jobBufs struct{ x, w, dy, r, dx, dw compute.Buffer }

func newJobBufs(t *testing.T, f *fakeBackend, rows, dim int) jobBufs {
	t.Helper()
	a := func(shape ...int) compute.Buffer {
		b, err := f.Alloc(compute.F32, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return jobBufs{a(rows, dim), a(dim), a(rows, dim), a(rows), a(rows, dim), a(dim)}
}

func ownAny(buf compute.Buffer) (*buffer, error) {
	b, ok := buf.(*buffer)
	if !ok {
		return nil, compute.ErrInvalidArgument
	}
	return b, nil
}

func record(t *testing.T, f *fakeBackend, fn func(cb *compute.CommandBuffer) error) []compute.Op {
	t.Helper()
	cb := compute.NewCommandBuffer(f)
	if err := fn(cb); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f.ops
}

// A worker batch (every RMSInv, barrier, every DX and DW) becomes ONE phase
// with one fused entry per job: r computed in the row loop and written.
func TestPlanFusesBatch(t *testing.T) {
	f := &fakeBackend{}
	shapes := [][2]int{{8, 1024}, {16384, 4096}, {3, 257}}
	var js []jobBufs
	for _, s := range shapes {
		js = append(js, newJobBufs(t, f, s[0], s[1]))
	}
	ops := record(t, f, func(cb *compute.CommandBuffer) error {
		for i, s := range shapes {
			if err := cb.RMSInv(js[i].x, js[i].r, compute.RMSInvParams(1e-5, s[1]), s[0], s[1]); err != nil {
				return err
			}
		}
		cb.Barrier()
		for i := len(shapes) - 1; i >= 0; i-- {
			s, j := shapes[i], js[i]
			if err := cb.DW(j.x, j.dy, j.r, j.dw, compute.DWParams(s[1], s[0]), s[0], s[1]); err != nil {
				return err
			}
			if err := cb.DX(j.x, j.w, j.dy, j.r, j.dx, compute.DXParams(s[1], 1e-5), s[0], s[1]); err != nil {
				return err
			}
		}
		return nil
	})
	p, err := planOps(ops, fixedGeom(264), ownAny)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.phases) != 2 || len(p.phases[0]) != 0 || len(p.phases[1]) != len(shapes) {
		t.Fatalf("phases %d (sizes %d, %d), want 2 with every job fused into the second", len(p.phases), len(p.phases[0]), len(p.phases[1]))
	}
	for i, e := range p.phases[1] {
		if e.flags() != flagComputeR|flagWriteR|flagDX|flagDW {
			t.Errorf("entry %d flags %b, want computeR|writeR|dx|dw", i, e.flags())
		}
		if e.eps != 1e-5 {
			t.Errorf("entry %d eps %g", i, e.eps)
		}
		if e.g*e.rg < e.rows || (e.g-1)*e.rg >= e.rows || e.g > 264 {
			t.Errorf("entry %d: %d rows in %d groups of %d", i, e.rows, e.g, e.rg)
		}
	}
	if e := p.phases[1][1]; e.g != 261 || e.rg != 63 {
		t.Errorf("16384 rows: %d groups of %d, want 261 of 63 (at most two blocks per SM on 132 SMs)", e.g, e.rg)
	}
	if len(p.uploads) != 3*len(shapes) {
		t.Errorf("%d uploads, want x, w, dy of each job (%d)", len(p.uploads), 3*len(shapes))
	}
	if len(p.downloads) != 3*len(shapes) {
		t.Errorf("%d downloads, want r, dx, dw of each job (%d)", len(p.downloads), 3*len(shapes))
	}
	for _, u := range p.uploads {
		for _, j := range js {
			if u == j.r || u == j.dx || u == j.dw {
				t.Fatalf("an output is uploaded")
			}
		}
	}
}

// When something else reads r in the next phase (here a DX of another x),
// the RMSInv must run alone in its phase and the readers read r.
func TestPlanNoFusionWhenRShared(t *testing.T) {
	f := &fakeBackend{}
	a, b := newJobBufs(t, f, 4, 32), newJobBufs(t, f, 4, 32)
	ops := record(t, f, func(cb *compute.CommandBuffer) error {
		if err := cb.RMSInv(a.x, a.r, compute.RMSInvParams(1e-6, 32), 4, 32); err != nil {
			return err
		}
		cb.Barrier()
		if err := cb.DX(a.x, a.w, a.dy, a.r, a.dx, compute.DXParams(32, 1e-6), 4, 32); err != nil {
			return err
		}
		return cb.DX(b.x, b.w, b.dy, a.r, b.dx, compute.DXParams(32, 1e-6), 4, 32)
	})
	p, err := planOps(ops, fixedGeom(264), ownAny)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.phases[0]) != 1 || p.phases[0][0].flags() != flagComputeR|flagWriteR {
		t.Fatalf("phase 0: %+v, want the RMSInv alone", p.phases[0])
	}
	if len(p.phases[1]) != 2 {
		t.Fatalf("phase 1 has %d entries, want 2 DX", len(p.phases[1]))
	}
	for _, e := range p.phases[1] {
		if e.flags() != flagDX || e.r != a.r.(*buffer) {
			t.Errorf("phase 1 entry flags %b, want a DX reading a's r", e.flags())
		}
	}
	// a.r is written in this command buffer, so it is not uploaded.
	for _, u := range p.uploads {
		if u == a.r.(*buffer) {
			t.Error("r written by the RMSInv is uploaded too")
		}
	}
}

// A DX reading an r from an earlier command buffer uploads that r.
func TestPlanUploadsForeignR(t *testing.T) {
	f := &fakeBackend{}
	a := newJobBufs(t, f, 2, 8)
	ops := record(t, f, func(cb *compute.CommandBuffer) error {
		return cb.DW(a.x, a.dy, a.r, a.dw, compute.DWParams(8, 2), 2, 8)
	})
	p, err := planOps(ops, fixedGeom(264), ownAny)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.uploads) != 3 || p.uploads[2] != a.r.(*buffer) {
		t.Fatalf("uploads %v, want x, dy, r", p.uploads)
	}
	if len(p.downloads) != 1 || p.downloads[0] != a.dw.(*buffer) {
		t.Fatalf("downloads %v, want dw", p.downloads)
	}
	// 2x8 is one group, which stores dw itself: no reduce blocks.
	if e := p.phases[0][0]; e.flags() != flagDW || e.g != 1 || e.redBlocks() != 0 {
		t.Fatalf("entry flags %b, %d groups, %d reduce blocks", e.flags(), e.g, e.redBlocks())
	}
	// 2x8192 in two groups: dw from partials, 2048 chunks / 8 reduce blocks.
	b := newJobBufs(t, f, 2, 8192)
	ops = record(t, f, func(cb *compute.CommandBuffer) error {
		return cb.DW(b.x, b.dy, b.r, b.dw, compute.DWParams(8192, 2), 2, 8192)
	})
	if p, err = planOps(ops, fixedGeom(264), ownAny); err != nil {
		t.Fatal(err)
	}
	if e := p.phases[0][0]; e.g != 2 || e.redBlocks() != 256 {
		t.Fatalf("2x8192: %d groups, %d reduce blocks; want 2, 256", e.g, e.redBlocks())
	}
}

func TestPlanRejectsForeignBuffer(t *testing.T) {
	f := &fakeBackend{}
	a := newJobBufs(t, f, 2, 8)
	ops := record(t, f, func(cb *compute.CommandBuffer) error {
		return cb.RMSInv(a.x, a.r, compute.RMSInvParams(1e-6, 8), 2, 8)
	})
	bad := errors.New("foreign")
	_, err := planOps(ops, fixedGeom(264), func(compute.Buffer) (*buffer, error) { return nil, bad })
	if !errors.Is(err, bad) {
		t.Fatalf("planOps with a foreign buffer: %v", err)
	}
}

func TestGroups(t *testing.T) {
	const wide = 1 << 20 // a dim wide enough that one row fills a group
	for _, c := range []struct{ rows, dim, gmax, align, rg, g int }{
		{1, wide, 264, 0, 1, 1}, {8, wide, 264, 0, 1, 8}, {264, wide, 264, 0, 1, 264}, {265, wide, 264, 0, 2, 133},
		{16384, 4096, 264, 0, 63, 261}, {32768, 8192, 264, 0, 125, 263}, {4096, 4096, 264, 0, 16, 256}, {1000, wide, 264, 0, 4, 250},
		// align 8: rounded up only when that adds at most 2%.
		{16384, 4096, 264, 8, 64, 256}, {32768, 8192, 264, 8, 125, 263}, {4096, 4096, 264, 8, 16, 256}, {1000, wide, 264, 8, 4, 250},
		{32768, 8192, 132, 8, 249, 132}, {265, wide, 264, 8, 2, 133}, {12288, 4096, 264, 8, 47, 262}, {12672, 4096, 264, 8, 48, 264},
		// At least minGroupElems (8192) elements per group for a job of
		// under smallJobElems (131072): one group, or a few.
		{8, 1024, 264, 0, 8, 1}, {8, 1024, 264, 8, 8, 1}, {20, 1024, 264, 0, 8, 3}, {16, 4096, 264, 8, 2, 8},
		{64, 4096, 264, 8, 1, 64}, {1000, 257, 264, 0, 4, 250}, {500, 257, 264, 0, 32, 16},
		{3, 257, 264, 0, 3, 1}, {7, 1, 3, 0, 7, 1}, {2, 8192, 264, 0, 1, 2},
	} {
		rg, g := groups(c.rows, c.dim, c.gmax, c.align)
		if rg != c.rg || g != c.g {
			t.Errorf("groups(%d, %d, %d, %d) = %d, %d; want %d, %d", c.rows, c.dim, c.gmax, c.align, rg, g, c.rg, c.g)
		}
	}
}

// fixedGeom splits rows into at most gmax groups and uses the register
// path of the dim's class.
func fixedGeom(gmax int) geomFunc {
	return func(rows, dim, cw int) geom {
		var gm geom
		gm.class, gm.threads = classOf(dim, cw)
		gm.rg, gm.g = groups(rows, dim, gmax, 0)
		return gm
	}
}

// Every multiple of the chunk width (4 for F32 rows, 8 for half rows) up to
// 8192 has a fused class of that width whose block fits its rows: a
// multiple of 32 threads, at most the class's, k chunks each covering the
// row with fewer than 32 threads idle; a wider dim never goes to a
// narrower class. The others have none and 256 threads.
func TestClassOf(t *testing.T) {
	for _, cw := range []int{4, 8} {
		prev := 0 // the widest row of the previous dim's class, in chunks
		for dim := cw; dim <= 8192; dim += cw {
			c, th := classOf(dim, cw)
			if c < 0 {
				t.Fatalf("cw %d dim %d: no fused class", cw, dim)
			}
			fc, nch := fusedClasses[c], dim/cw
			if fc.cw != cw || th%32 != 0 || th > fc.maxThreads || th*fc.k < nch || (th-32)*fc.k >= nch || nch > fc.maxNch || fc.maxNch < prev {
				t.Fatalf("cw %d dim %d: class %d (%+v), %d threads", cw, dim, c, fc, th)
			}
			if n := (&Backend{}).classSmem(c, fc.maxDim(th)); fc.ws && n < 8*dim {
				t.Fatalf("cw %d dim %d: class %d reserves %d bytes of shared memory for %d", cw, dim, c, n, 8*dim)
			}
			prev = fc.maxNch
		}
		for _, dim := range []int{1, 3, 257, 4097, 8196, 9000, 16384, 8200} {
			if c, th := classOf(dim, cw); c != -1 || th != rowsThreads {
				t.Errorf("cw %d dim %d: class %d, %d threads; want -1, %d", cw, dim, c, th, rowsThreads)
			}
		}
	}
	if c, _ := classOf(1028, 8); c != -1 {
		t.Errorf("cw 8 dim 1028 (not a multiple of 8): class %d; want -1", c)
	}
	for _, c := range []struct{ dim, cw, class, threads int }{
		{1024, 4, 0, 128}, {768, 4, 0, 96}, {1152, 4, 1, 160}, {2048, 4, 1, 256}, {2560, 4, 2, 224}, {3072, 4, 2, 256},
		{3584, 4, 3, 224}, {4096, 4, 3, 256}, {4224, 4, 4, 288}, {4352, 4, 4, 288}, {4480, 4, 5, 288}, {4864, 4, 5, 320}, {5120, 4, 5, 320}, {5248, 4, 5, 352}, {6144, 4, 5, 384},
		{6272, 4, 6, 416}, {7168, 4, 6, 448}, {8192, 4, 6, 512},
		{1024, 8, 7, 64}, {1152, 8, 12, 96}, {1536, 8, 12, 96}, {2048, 8, 12, 128}, {2176, 8, 8, 160}, {3072, 8, 8, 192}, {4096, 8, 8, 256}, {4224, 8, 9, 160},
		{5120, 8, 9, 160}, {5248, 8, 10, 192}, {6144, 8, 10, 192}, {6272, 8, 11, 224}, {8192, 8, 11, 256},
	} {
		if cl, th := classOf(c.dim, c.cw); cl != c.class || th != c.threads {
			t.Errorf("classOf(%d, %d) = %d, %d; want %d, %d", c.dim, c.cw, cl, th, c.class, c.threads)
		}
	}
}

// The geometry of an H200 (132 SMs, 227 KiB of shared memory per block)
// with the occupancy the fused classes' launch bounds guarantee (the
// backend measures the real one at Open). By default: the dim's class and
// block size, as many groups as blocks fit at once (at least minGroupElems
// elements each), no slots. With RMSGRAD_CUDA_STAGES (maxStages > 0): 256
// threads, two blocks per SM, the slots for every multiple of 4 up to
// 8192, as many (up to maxStages) as half the shared memory holds.
func TestGeometry(t *testing.T) {
	for _, c := range []struct {
		maxStages, rows, dim int
		want                 geom
		cw                   int // 0: 4
	}{
		{0, 16384, 4096, geom{rg: 63, g: 261, threads: 256, class: 3}, 0},
		{0, 32768, 8192, geom{rg: 249, g: 132, threads: 512, class: 6}, 0},
		{0, 4096, 4096, geom{rg: 16, g: 256, threads: 256, class: 3}, 0},
		{0, 16384, 5120, geom{rg: 125, g: 132, threads: 320, class: 5}, 0},
		{0, 16384, 4352, geom{rg: 63, g: 261, threads: 288, class: 4}, 0},
		{0, 16384, 6144, geom{rg: 125, g: 132, threads: 384, class: 5}, 0},
		{0, 16384, 7168, geom{rg: 125, g: 132, threads: 448, class: 6}, 0},
		{0, 16384, 1024, geom{rg: 32, g: 512, threads: 128, class: 0}, 0},
		{0, 16384, 1152, geom{rg: 25, g: 656, threads: 160, class: 1}, 0},
		{0, 16384, 2560, geom{rg: 63, g: 261, threads: 224, class: 2}, 0},
		{0, 100000, 1024, geom{rg: 190, g: 527, threads: 128, class: 0}, 0},
		{0, 1000, 257, geom{rg: 4, g: 250, threads: 256, class: -1}, 0},
		{0, 8, 1024, geom{rg: 8, g: 1, threads: 128, class: 0}, 0},
		{0, 64, 16384, geom{rg: 1, g: 64, threads: 256, class: -1}, 0},
		{0, 7, 4097, geom{rg: 2, g: 4, threads: 256, class: -1}, 0},
		{4, 16384, 4096, geom{rg: 63, g: 261, stages: 3, threads: 256, class: -1}, 0},
		{4, 32768, 8192, geom{rg: 125, g: 263, stages: 1, threads: 256, class: -1}, 0},
		{4, 16384, 5120, geom{rg: 63, g: 261, stages: 2, threads: 256, class: -1}, 0},
		{4, 8, 1024, geom{rg: 8, g: 1, stages: 4, threads: 256, class: -1}, 0},
		{4, 1000, 257, geom{rg: 4, g: 250, threads: 256, class: -1}, 0},
		{4, 64, 16384, geom{rg: 1, g: 64, threads: 256, class: -1}, 0},
		{2, 4096, 4096, geom{rg: 16, g: 256, stages: 2, threads: 256, class: -1}, 0},
		// Half rows (chunks of 8): classes c7 to c11, never slots.
		{0, 16384, 4096, geom{rg: 42, g: 391, threads: 256, class: 8}, 8},
		{0, 16384, 2176, geom{rg: 25, g: 656, threads: 160, class: 8}, 8},
		{0, 16384, 4224, geom{rg: 42, g: 391, threads: 160, class: 9}, 8},
		{0, 32768, 8192, geom{rg: 125, g: 263, threads: 256, class: 11}, 8},
		{0, 16384, 6144, geom{rg: 32, g: 512, threads: 192, class: 10}, 8}, // four blocks of 192 a SM
		{0, 16384, 1024, geom{rg: 16, g: 1024, threads: 64, class: 7}, 8},
		{4, 16384, 4096, geom{rg: 42, g: 391, threads: 256, class: 8}, 8},
		{0, 64, 16384, geom{rg: 1, g: 64, threads: 256, class: -1}, 8},
	} {
		b := &Backend{sms: 132, smemOptin: 232448, maxStages: c.maxStages}
		got := b.geometry(c.rows, c.dim, max(c.cw, 4))
		if got != c.want {
			t.Errorf("stages<=%d: geometry(%d, %d) = %+v; want %+v", c.maxStages, c.rows, c.dim, got, c.want)
		}
		if 2*(got.stages*8*c.dim+smemReserve) > int(b.smemOptin)+smemReserve {
			t.Errorf("geometry(%d, %d): %d slots: two blocks do not fit on an SM", c.rows, c.dim, got.stages)
		}
	}
	// With the driver's occupancy: the groups follow it.
	b := &Backend{sms: 132, smemOptin: 232448}
	b.occ = make([][]int, len(fusedClasses))
	for c, fc := range fusedClasses {
		b.occ[c] = make([]int, fc.maxThreads/32)
		for i := range b.occ[c] {
			b.occ[c][i] = 4
		}
	}
	if got := b.geometry(16384, 1024, 4); got.g != 512 || got.rg != 32 {
		t.Errorf("occupancy 4: geometry(16384, 1024) = %+v; want 512 groups of 32", got)
	}
}

// TestLaunchConfigLayout: launchConfig and launchAttr match CUlaunchConfig
// and CUlaunchAttribute of cuda.h on 64-bit hosts (cuLaunchKernelEx reads
// them as C structs).
func TestLaunchConfigLayout(t *testing.T) {
	var c launchConfig
	var a launchAttr
	for _, f := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(CUlaunchConfig)", unsafe.Sizeof(c), 56},
		{"CUlaunchConfig.sharedMemBytes", unsafe.Offsetof(c.sharedMem), 24},
		{"CUlaunchConfig.hStream", unsafe.Offsetof(c.stream), 32},
		{"CUlaunchConfig.attrs", unsafe.Offsetof(c.attrs), 40},
		{"CUlaunchConfig.numAttrs", unsafe.Offsetof(c.numAttrs), 48},
		{"sizeof(CUlaunchAttribute)", unsafe.Sizeof(a), 72},
		{"CUlaunchAttribute.value", unsafe.Offsetof(a.value), 8},
	} {
		if f.got != f.want {
			t.Errorf("%s = %d, want %d", f.name, f.got, f.want)
		}
	}
}

// TestPlanDTypes: an entry's types word carries each tensor's dtype and the
// IO type x, dy and dx share (typeAny when they differ); fused kernels are
// taken only for one IO type, and half x or dy get no shared-memory slots
// (RMSGRAD_CUDA_STAGES).
func TestPlanDTypes(t *testing.T) {
	f := &fakeBackend{}
	alloc := func(dt compute.DType, shape ...int) compute.Buffer {
		b, err := f.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// F32 rows: fused class c4 (288 threads); half x: chunks of 8, class c9
	// (160 threads), never slots.
	const rows, dim = 64, 4352
	for _, c := range []struct {
		name                 string
		x, w, dy, dx, dw     compute.DType
		types                int32
		kernel, stages       int
		smemKernel, smemStag int // with RMSGRAD_CUDA_STAGES=4
		threads, smemThreads int
	}{
		{"f32", compute.F32, compute.F32, compute.F32, compute.F32, compute.F32, 0, kFused0 + 4, 0, kRows, 1, 288, 256},
		{"bf16", compute.BF16, compute.BF16, compute.BF16, compute.BF16, compute.BF16, 1 | 1<<2 | 1<<4 | 1<<6 | 1<<8 | 1<<10, kFused0 + 9, 0, kFused0 + 9, 0, 160, 160},
		{"bf16 x, dy; f32 w, dw", compute.BF16, compute.F32, compute.BF16, compute.BF16, compute.F32, 1 | 1<<4 | 1<<6 | 1<<10, kFused0 + 9, 0, kFused0 + 9, 0, 160, 160},
		{"f16 in, f32 grads", compute.F16, compute.F16, compute.F16, compute.F32, compute.F32, 2 | 2<<2 | 2<<4 | 3<<10, kRows, 0, kRows, 0, 160, 160},
		{"f16", compute.F16, compute.F16, compute.F16, compute.F16, compute.F16, 2 | 2<<2 | 2<<4 | 2<<6 | 2<<8 | 2<<10, kFusedF16 + 9 - firstHalfClass, 0, kFusedF16 + 9 - firstHalfClass, 0, 160, 160},
		{"f32 x, dy; bf16 dx", compute.F32, compute.BF16, compute.F32, compute.BF16, compute.BF16, 1<<2 | 1<<6 | 1<<8 | 3<<10, kRows, 0, kRows, 1, 288, 256},
	} {
		x, w, dy, r, dx, dw := alloc(c.x, rows, dim), alloc(c.w, dim), alloc(c.dy, rows, dim), alloc(compute.F32, rows), alloc(c.dx, rows, dim), alloc(c.dw, dim)
		ops := record(t, f, func(cb *compute.CommandBuffer) error {
			if err := cb.RMSInv(x, r, compute.RMSInvParams(1e-5, dim), rows, dim); err != nil {
				return err
			}
			cb.Barrier()
			if err := cb.DX(x, w, dy, r, dx, compute.DXParams(dim, 1e-5), rows, dim); err != nil {
				return err
			}
			return cb.DW(x, dy, r, dw, compute.DWParams(dim, rows), rows, dim)
		})
		for _, maxStages := range []int{0, 4} {
			b := &Backend{sms: 132, smemOptin: 232448, maxStages: maxStages}
			p, err := planOps(ops, b.geometry, ownAny)
			if err != nil {
				t.Fatal(err)
			}
			e := p.phases[1][0]
			k, st, th := c.kernel, c.stages, c.threads
			if maxStages > 0 {
				k, st, th = c.smemKernel, c.smemStag, c.smemThreads
			}
			if e.types() != c.types || e.kernel() != k || e.stages != st || e.threads != th {
				t.Errorf("%s, stages<=%d: types %#x, kernel %d, stages %d, %d threads; want %#x, %d, %d, %d",
					c.name, maxStages, e.types(), e.kernel(), e.stages, e.threads, c.types, k, st, th)
			}
			// c4, c8 and c9 keep w and the dw sums in shared memory.
			wantSmem := st * 8 * dim
			if c := kernelClass(k); c == 4 || c == 8 || c == 9 {
				wantSmem = 8 * dim
			}
			if got := b.smemBytes(&e); got != wantSmem {
				t.Errorf("%s, stages<=%d: %d bytes of shared memory; want %d", c.name, maxStages, got, wantSmem)
			}
		}
	}
	// At 4096 the fused kernels: for a shared IO type, not for a mix.
	for _, c := range []struct {
		x, dy, dx compute.DType
		kernel    int
	}{{compute.BF16, compute.BF16, compute.BF16, kFused0 + 8}, {compute.F16, compute.F16, compute.F16, kFusedF16 + 8 - firstHalfClass},
		{compute.BF16, compute.BF16, compute.F32, kRows}, {compute.F16, compute.BF16, compute.F16, kRows}} {
		x, w, dy, r, dx, dw := alloc(c.x, 8, 4096), alloc(compute.F32, 4096), alloc(c.dy, 8, 4096), alloc(compute.F32, 8), alloc(c.dx, 8, 4096), alloc(compute.F32, 4096)
		ops := record(t, f, func(cb *compute.CommandBuffer) error {
			if err := cb.RMSInv(x, r, compute.RMSInvParams(1e-5, 4096), 8, 4096); err != nil {
				return err
			}
			cb.Barrier()
			if err := cb.DX(x, w, dy, r, dx, compute.DXParams(4096, 1e-5), 8, 4096); err != nil {
				return err
			}
			return cb.DW(x, dy, r, dw, compute.DWParams(4096, 8), 8, 4096)
		})
		p, err := planOps(ops, fixedGeom(264), ownAny)
		if err != nil {
			t.Fatal(err)
		}
		if k := p.phases[1][0].kernel(); k != c.kernel {
			t.Errorf("x %s dy %s dx %s: kernel %d, want %d", c.x, c.dy, c.dx, k, c.kernel)
		}
	}
}

func TestParseBenchShapes(t *testing.T) {
	got, err := parseBenchShapes("16384x4096, 32768x8192:bf16,1000x257:F16")
	if err != nil {
		t.Fatal(err)
	}
	want := []benchShape{{16384, 4096, compute.F32}, {32768, 8192, compute.BF16}, {1000, 257, compute.F16}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("parseBenchShapes = %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"16384", "4x4:f64", "0x4", "ax4"} {
		if _, err := parseBenchShapes(bad); err == nil {
			t.Errorf("parseBenchShapes(%q) accepted", bad)
		}
	}
}

// Every function field of driverAPI is bound by loadDriver (driverSymbols),
// but the optional cuLaunchKernelEx: a field left out is a nil function
// that panics on a GPU host only.
func TestDriverSymbols(t *testing.T) {
	d := &driverAPI{}
	bound := map[uintptr]bool{}
	for _, p := range driverSymbols(d, "cuEventElapsedTime_v2") {
		bound[reflect.ValueOf(p).Pointer()] = true
	}
	v := reflect.ValueOf(d).Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type.Kind() != reflect.Func || f.Name == "cuLaunchKernelEx" {
			continue
		}
		if !bound[v.Field(i).Addr().Pointer()] {
			t.Errorf("driverAPI.%s is not in driverSymbols", f.Name)
		}
	}
	n := 0
	for i := range v.NumField() {
		if v.Field(i).Kind() == reflect.Func {
			n++
		}
	}
	if len(bound) != n-1 {
		t.Errorf("driverSymbols binds %d fields, driverAPI has %d function fields (one optional)", len(bound), n)
	}
}

// Each kernel is in one NVRTC program (kernelParts), and the .cu keeps it
// in that part: the nearest RMS_PART_IS guard above its definition names
// the part. A mismatch would fail only on a GPU host (a kernel missing
// from its module).
func TestKernelParts(t *testing.T) {
	src := shaders.CUDASource
	seen := map[string]bool{}
	for p, names := range kernelParts() {
		for _, name := range names {
			if seen[name] {
				t.Errorf("kernel %s in two parts", name)
			}
			seen[name] = true
			def := -1
			for _, pat := range []string{" " + name + "(", "RMS_FUSED_F32(" + name + ",", "RMS_FUSED_HALF(" + name + ",", "RMS_FUSED_C9(" + name + ","} {
				if i := strings.Index(src, pat); i >= 0 && (def < 0 || i < def) {
					// The definition, not a mention in a comment.
					if ls := strings.LastIndex(src[:i], "\n"); !strings.HasPrefix(strings.TrimSpace(src[ls+1:i+1]), "//") {
						def = i
					}
				}
			}
			if def < 0 {
				t.Errorf("kernel %s: no definition in %s", name, shaders.CUDAFile)
				continue
			}
			// The RMS_PART_IS guards open at the definition (a stack of the
			// preprocessor conditionals above it).
			var stack []string
			for _, l := range strings.Split(src[:def], "\n") {
				switch l = strings.TrimSpace(l); {
				case strings.HasPrefix(l, "#if"):
					stack = append(stack, l)
				case strings.HasPrefix(l, "#endif") && len(stack) > 0:
					stack = stack[:len(stack)-1]
				}
			}
			n, found := -1, 0
			for _, c := range stack {
				if _, err := fmt.Sscanf(c, "#if RMS_PART_IS(%d)", &n); err == nil {
					found++
				}
			}
			if found != 1 || n != p {
				t.Errorf("kernel %s: %d RMS_PART_IS guards open (part %d), kernelParts has it in part %d", name, found, n, p)
			}
		}
	}
	for _, name := range append(append([]string{shaders.CUDARowsKernel, shaders.CUDAReduceKernel, shaders.CUDAAddKernel, shaders.CUDASpinKernel, shaders.CUDAFillKernel}, shaders.CUDARowsFusedKernels[:]...), shaders.CUDARowsFusedF16Kernels[:]...) {
		if !seen[name] {
			t.Errorf("kernel %s is in no part", name)
		}
	}
}

// RMSGRAD_CUDA_CACHE names the compiled kernels' directory, "off" disables
// it, and by default it is under the user's cache directory.
func TestCubinCacheDir(t *testing.T) {
	t.Setenv("RMSGRAD_CUDA_CACHE", "/some/dir")
	if d := cubinCacheDir(); d != "/some/dir" {
		t.Errorf("RMSGRAD_CUDA_CACHE=/some/dir: %q", d)
	}
	t.Setenv("RMSGRAD_CUDA_CACHE", "off")
	if d := cubinCacheDir(); d != "" {
		t.Errorf("RMSGRAD_CUDA_CACHE=off: %q", d)
	}
	t.Setenv("RMSGRAD_CUDA_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if d := cubinCacheDir(); d != "/xdg/rmsgrad/cuda" {
		t.Errorf("default with XDG_CACHE_HOME=/xdg: %q", d)
	}
}

// storeCubin writes the file atomically and leaves no temporary behind.
func TestStoreCubin(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	storeCubin(dir, "k", []byte("cubin"))
	if b, err := os.ReadFile(filepath.Join(dir, "k.cubin")); err != nil || string(b) != "cubin" {
		t.Fatalf("read back: %q, %v", b, err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(m) != 0 {
		t.Fatalf("temporaries left: %v", m)
	}
}

// TestHalfSlotsEnv: RMSGRAD_CUDA_HALF_SLOTS is read as P or P,R (bad values
// refused, naming the variable), compiles class c9's program only with the
// slots, and sizes c9's shared memory (4*P*dim bytes) while the other
// classes keep theirs.
func TestHalfSlotsEnv(t *testing.T) {
	for _, c := range []struct {
		v    string
		p, r int
		ok   bool
	}{{"", 0, 0, true}, {"0", 0, 0, true}, {"3", 3, 1, true}, {"4,2", 4, 2, true}, {"2,1", 2, 1, true},
		{"1", 0, 0, false}, {"5", 0, 0, false}, {"3,3", 0, 0, false}, {"x", 0, 0, false}, {"3,0", 0, 0, false}} {
		t.Setenv("RMSGRAD_CUDA_HALF_SLOTS", c.v)
		p, r, err := halfSlotsEnv()
		if (err == nil) != c.ok || p != c.p || r != c.r {
			t.Errorf("%q: %d, %d, %v; want %d, %d, ok %v", c.v, p, r, err, c.p, c.r, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "RMSGRAD_CUDA_HALF_SLOTS") {
			t.Errorf("%q: the error does not name the variable: %v", c.v, err)
		}
	}
	bs := &Backend{arch: "sm_90", halfSlots: 4, halfSlotsR: 2}
	for p, names := range kernelParts() {
		has := strings.Contains(strings.Join(bs.compileOpts(p), " "), "-DRMS_C9_SLOTS=4 -DRMS_C9_SLOTS_R=2")
		if want := slices.Contains(names, shaders.CUDARowsFusedKernels[9]) || slices.Contains(names, shaders.CUDARowsFusedF16Kernels[2]); has != want {
			t.Errorf("part %d (%v): slots options %v, want %v", p, names, has, want)
		}
	}
	b := &Backend{halfSlots: 3}
	if got := b.classSmem(9, 6144); got != 4*3*6144 {
		t.Errorf("c9 with 3 slots at 6144: %d bytes; want %d", got, 4*3*6144)
	}
	if got := b.classSmem(8, 4096); got != 8*4096 {
		t.Errorf("c8 at 4096 with c9's slots: %d bytes; want %d", got, 8*4096)
	}
	if got := b.classSmem(4, 5120); got != 8*5120 {
		t.Errorf("c4 at 5120: %d bytes; want %d", got, 8*5120)
	}
	if got := (&Backend{}).classSmem(9, 6144); got != 8*6144 {
		t.Errorf("c9 without slots at 6144: %d bytes; want %d", got, 8*6144)
	}
}
