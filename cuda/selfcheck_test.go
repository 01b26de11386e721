package cuda

import (
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
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
