package shaders

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

// fakeBuf is a compute.Buffer with a shape and no memory: planning never
// touches tensor data.
type fakeBuf struct {
	dtype compute.DType
	n     int
}

func (b *fakeBuf) DType() compute.DType { return b.dtype }
func (b *fakeBuf) Shape() []int         { return []int{b.n} }
func (b *fakeBuf) Len() int             { return b.n }
func (b *fakeBuf) Bytes() []byte        { return nil }
func (b *fakeBuf) Float32s() []float32  { return nil }
func (b *fakeBuf) Release()             {}

type fakeJob struct {
	rows, dim           int
	x, w, dy, r, dx, dw compute.Buffer
}

func newFakeJob(rows, dim int) *fakeJob {
	f := func(n int) compute.Buffer { return &fakeBuf{compute.F32, n} }
	return &fakeJob{rows: rows, dim: dim, x: f(rows * dim), w: f(dim), dy: f(rows * dim), r: f(rows), dx: f(rows * dim), dw: f(dim)}
}

// opsOf records jobs as a worker batch does: every RMSInv, a barrier, every
// DX and DW.
func opsOf(t *testing.T, jobs ...*fakeJob) []compute.Op {
	t.Helper()
	cb := compute.NewCommandBuffer(nil)
	for _, j := range jobs {
		if err := cb.RMSInv(j.x, j.r, compute.RMSInvParams(1e-5, j.dim), j.rows, j.dim); err != nil {
			t.Fatal(err)
		}
	}
	cb.Barrier()
	for _, j := range jobs {
		if err := cb.DX(j.x, j.w, j.dy, j.r, j.dx, compute.DXParams(j.dim, 1e-5), j.rows, j.dim); err != nil {
			t.Fatal(err)
		}
		if err := cb.DW(j.x, j.dy, j.r, j.dw, compute.DWParams(j.dim, j.rows), j.rows, j.dim); err != nil {
			t.Fatal(err)
		}
	}
	return cb.Ops()
}

func TestGeometry(t *testing.T) {
	for _, c := range []struct{ dim, max, want int }{
		{1, 512, 64}, {512, 512, 64}, {513, 512, 128}, {1024, 512, 128}, {2048, 512, 256},
		{4096, 512, 512}, {8192, 512, 512}, {9000, 512, 512}, {8192, 256, 256}, {4096, 0, 512},
	} {
		if got := RowThreads(c.dim, c.max); got != c.want {
			t.Errorf("RowThreads(%d, %d) = %d, want %d", c.dim, c.max, got, c.want)
		}
	}
	for _, c := range []struct{ rows, want int }{{1, 1}, {31, 1}, {32, 2}, {1000, 62}, {4096, 256}, {1 << 20, 256}} {
		if got := RowGroups(c.rows); got != c.want {
			t.Errorf("RowGroups(%d) = %d, want %d", c.rows, got, c.want)
		}
	}
}

func TestCheckMetalDevice(t *testing.T) {
	for _, c := range []struct {
		width, max int
		ok         bool
		wantMax    int
	}{
		{32, 1024, true, 512}, {8, 768, true, 512}, {64, 256, true, 256}, {16, 384, true, 256},
		{32, 32, false, 0}, {4, 1024, false, 0}, {128, 1024, false, 0}, {24, 1024, false, 0},
	} {
		d, err := CheckMetalDevice("GPU X", c.width, c.max)
		if c.ok != (err == nil) {
			t.Errorf("width %d, max %d: err %v, want ok=%v", c.width, c.max, err, c.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, compute.ErrUnsupported) || !strings.Contains(err.Error(), "GPU X") {
				t.Errorf("width %d, max %d: %v: want ErrUnsupported naming the GPU", c.width, c.max, err)
			}
			continue
		}
		if d.MaxThreads != c.wantMax || d.SimdWidth != c.width {
			t.Errorf("width %d, max %d: %+v, want cap %d", c.width, c.max, d, c.wantMax)
		}
	}
}

// A worker batch: per job one fused rows dispatch (flags R|WR|DX|DW), then a
// barrier and the reduces of the jobs with several row groups.
func TestPlanBatch(t *testing.T) {
	small, tall := newFakeJob(8, 1024), newFakeJob(1000, 257)
	p, err := PlanMetal(opsOf(t, small, tall), MetalDevice{SimdWidth: 32})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, s := range p.Steps {
		switch s.Kind {
		case StepBarrier:
			kinds = append(kinds, "|")
		case StepCommit:
			kinds = append(kinds, "commit")
		default:
			kinds = append(kinds, s.Kernel)
		}
	}
	want := []string{MetalRowsKernel, MetalRowsKernel, "|", MetalReduceKernel}
	if !slices.Equal(kinds, want) {
		t.Fatalf("steps %v, want %v", kinds, want)
	}
	flags := func(d *Dispatch) uint32 {
		return binary.LittleEndian.Uint32(d.Bindings[len(d.Bindings)-1].Bytes[16:])
	}
	all := uint32(MetalFlagComputeR | MetalFlagWriteR | MetalFlagDX | MetalFlagDW)
	if f := flags(&p.Steps[0].Dispatch); f != all|MetalFlagDWDirect {
		t.Errorf("8x1024: flags %b, want every flag and dw direct (one group)", f)
	}
	if f := flags(&p.Steps[1].Dispatch); f != all {
		t.Errorf("1000x257: flags %b, want every flag, partials", f)
	}
	if g := p.Steps[1].Threadgroups[0]; g != RowGroups(1000) {
		t.Errorf("1000x257: %d threadgroups, want %d", g, RowGroups(1000))
	}
	if len(p.Scratch) != 1 || p.Scratch[0] != 4*RowGroups(1000)*257 {
		t.Errorf("scratch %v, want one of %d bytes", p.Scratch, 4*RowGroups(1000)*257)
	}
	for _, b := range p.Steps[0].Bindings {
		if b.Name != "geom" && b.Kind != BindBuffer && b.Name != "part" {
			t.Errorf("fused 8x1024: %s bound as %d, want its tensor", b.Name, b.Kind)
		}
	}

	// Apart: three entries, three phases, placeholders where flags leave
	// arguments unused.
	p, err = PlanMetal(opsOf(t, small), MetalDevice{SimdWidth: 32, NoFuse: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(p.Steps); n != 4 { // rows(R) | rows(DX) rows(DW)
		t.Fatalf("unfused: %d steps, want 4", n)
	}
	for _, b := range p.Steps[0].Bindings {
		if (b.Name == "w" || b.Name == "dy" || b.Name == "dx" || b.Name == "part") != (b.Kind == BindNone) {
			t.Errorf("RMSInv alone: %s bound as kind %d", b.Name, b.Kind)
		}
	}
}

// Memory traffic at large shapes, from the plan's own accounting of what
// the kernels read and write: at most 13 bytes per element of f32 (12 is
// the minimum: x and dy read, dx written).
func TestPlanBytesPerElement(t *testing.T) {
	for _, s := range []struct{ rows, dim int }{{16384, 4096}, {32768, 8192}, {4096, 4096}, {16384, 5120}, {65536, 1024}} {
		j := newFakeJob(s.rows, s.dim)
		p, err := PlanMetal(opsOf(t, j), MetalDevice{SimdWidth: 32, MaxCommandBytes: 1 << 62})
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, st := range p.Steps {
			total += st.Bytes
		}
		per := float64(total) / float64(s.rows*s.dim)
		t.Logf("%dx%d: %.3f bytes per element", s.rows, s.dim, per)
		if per < 12 || per > 13 {
			t.Errorf("%dx%d: %.3f bytes per element, want 12..13", s.rows, s.dim, per)
		}
	}
}

// A plan over the command-buffer bound is split: every command buffer's
// traffic stays within it (or is one dispatch of one row group), the split
// dispatches of a job cover its row groups exactly once, in order.
func TestPlanSplit(t *testing.T) {
	j := newFakeJob(16384, 4096)
	const limit = 64 << 20
	p, err := PlanMetal(opsOf(t, j, newFakeJob(8, 1024)), MetalDevice{SimdWidth: 32, MaxCommandBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	if p.Commands() < 10 {
		t.Fatalf("%d command buffers for %d MiB of traffic under a %d MiB bound", p.Commands(), 16384*4096*12>>20, limit>>20)
	}
	var cur int64
	var n int
	next := 0
	for _, s := range p.Steps {
		switch s.Kind {
		case StepCommit:
			if cur > limit && n > 1 {
				t.Errorf("a command buffer of %d dispatches carries %d bytes > %d", n, cur, limit)
			}
			cur, n = 0, 0
		case StepDispatch:
			cur += s.Bytes
			n++
			if s.Kernel == MetalRowsKernel && s.Threads[0] == RowThreads(4096, 0) {
				g0 := int(binary.LittleEndian.Uint32(s.Bindings[len(s.Bindings)-1].Bytes[12:]))
				if g0 != next {
					t.Fatalf("split dispatch starts at group %d, want %d", g0, next)
				}
				next += s.Threadgroups[0]
			}
		}
	}
	if next != RowGroups(16384) {
		t.Fatalf("split dispatches cover %d groups, want %d", next, RowGroups(16384))
	}
}
