package cuda

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
)

// The self-check Open runs covers every rows kernel (each fused class and
// the general kernel) and the dw reduction, as the planner places its jobs
// on an H200 (132 SMs, the occupancy the launch bounds guarantee).
func TestSelfCheckCoversKernels(t *testing.T) {
	f := &fakeBackend{}
	jobs := selfCheckJobs()
	elems := 0
	ops := record(t, f, func(cb *compute.CommandBuffer) error {
		type bufs struct{ x, w, dy, r, dx, dw compute.Buffer }
		all := make([]bufs, len(jobs))
		for i, j := range jobs {
			m := j.Mix.Norm()
			a := func(dt compute.DType, shape ...int) compute.Buffer {
				b, err := f.Alloc(dt, shape...)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			all[i] = bufs{a(m.X, j.Rows, j.Dim), a(m.W, j.Dim), a(m.DY, j.Rows, j.Dim), a(compute.F32, j.Rows), a(m.DX, j.Rows, j.Dim), a(m.DW, j.Dim)}
			elems += j.Rows * j.Dim
			if err := cb.RMSInv(all[i].x, all[i].r, compute.RMSInvParams(j.Eps, j.Dim), j.Rows, j.Dim); err != nil {
				return err
			}
		}
		cb.Barrier()
		for i, j := range jobs {
			a := all[i]
			if err := cb.DX(a.x, a.w, a.dy, a.r, a.dx, compute.DXParams(j.Dim, j.Eps), j.Rows, j.Dim); err != nil {
				return err
			}
			if err := cb.DW(a.x, a.dy, a.r, a.dw, compute.DWParams(j.Dim, j.Rows), j.Rows, j.Dim); err != nil {
				return err
			}
		}
		return nil
	})
	b := &Backend{sms: 132, smemOptin: 232448}
	p, err := planOps(ops, b.geometry, ownAny)
	if err != nil {
		t.Fatal(err)
	}
	used := map[int]bool{}
	reduce := false
	for _, ph := range p.phases {
		for _, e := range ph {
			used[e.kernel()] = true
			reduce = reduce || e.redBlocks() > 0
		}
	}
	for k := 0; k < nKernels; k++ {
		if !used[k] {
			t.Errorf("the self-check runs nothing in %s", rowsKernelName(k))
		}
	}
	if !reduce {
		t.Error("the self-check runs no dw reduction")
	}
	if elems > 3<<20 {
		t.Errorf("the self-check holds %d elements; keep it small (it runs at every Open)", elems)
	}
}

// broken wraps a backend and damages its outputs after each Execute: flip
// changes one bit of the first DX output of every command buffer; drift
// does so only on every other command buffer (results that depend on the
// run, as a race gives).
type broken struct {
	compute.Backend
	flip, drift bool
	n           int
}

func (b *broken) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	d, err := b.Backend.Execute(ctx, ops)
	b.n++
	if err != nil || !(b.flip || b.drift && b.n%2 == 0) {
		return d, err
	}
	for _, o := range ops {
		if o.Kind == compute.OpDX {
			o.DX.Bytes()[1] ^= 0x40 // a bit of the first element's mantissa
			break
		}
	}
	return d, nil
}

// The self-check passes on a correct backend (the CPU's) and refuses,
// with compute.ErrUnsupported and the job named, one whose values are
// wrong and one whose bits change from run to run.
func TestSelfCheckRefusesWrongBackends(t *testing.T) {
	ctx := context.Background()
	good := cpu.New()
	defer good.Close()
	if err := selfCheck(ctx, good, "cpu"); err != nil {
		t.Fatalf("the CPU backend fails the self-check: %v", err)
	}
	for _, c := range []struct {
		name string
		be   *broken
		want string
	}{
		{"wrong values", &broken{Backend: good, flip: true}, "job 3x1024"},
		{"bits that change", &broken{Backend: good, drift: true}, "gives other bits"},
	} {
		err := selfCheck(ctx, c.be, "test GPU")
		if err == nil || !errors.Is(err, compute.ErrUnsupported) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "test GPU") {
			t.Errorf("%s: self-check = %v; want an ErrUnsupported naming %q and the device", c.name, err, c.want)
		}
	}
}
