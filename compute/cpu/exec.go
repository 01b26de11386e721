package cpu

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rmsgrad/rmsgrad/compute"
)

// rowBlock is the number of consecutive rows one task handles and one dw
// partial sums. It depends only on dim, so the dw summation order is fixed
// by the shape: at least 32 rows, and at least 128 Ki elements so that tiny
// rows still make tasks worth scheduling.
func rowBlock(dim int) int {
	return max(32, (128<<10+dim-1)/dim)
}

// reduceChunk is the number of features one dw-reduction task sums.
const reduceChunk = 4096

// unit is the work of one job's kernels in one phase: an RMSInv alone, a DX
// and/or DW reading r, or an RMSInv fused with the DX and/or DW after it.
type unit struct {
	x, w, dy  []float32
	rIn       []float32 // r to read (unfused DX/DW)
	rOut      []float32 // r to write (RMSInv, alone or fused)
	dx, dw    []float32 // outputs; nil when not computed
	rows, dim int
	eps       float32
	rb, nblk  int
	part      []float32 // nblk*dim dw partials when nblk > 1
	nt        bool      // stream dx past the caches (see ntBytes)
}

// ntBytes is the dx size from which stores bypass the cache: beyond a
// few MiB dx cannot stay cached for its reader anyway, and a plain store
// would first read each line (read-for-ownership), a third more traffic.
const ntBytes = 4 << 20

type plan struct {
	be     *Backend
	phases [][]*unit
	parts  [][]float32 // pooled partial stores to release
}

func (p *plan) release() {
	for _, w := range p.parts {
		p.be.pool.put(w)
	}
	p.parts = nil
}

// f32 returns the host view of a buffer of this backend.
func (b *Backend) f32(buf compute.Buffer) ([]float32, error) {
	if buf == nil {
		return nil, nil
	}
	cb, ok := buf.(*buffer)
	if !ok || cb.be != b || cb.released {
		return nil, fmt.Errorf("cpu: buffer %T is not a live buffer of this backend: %w", buf, compute.ErrInvalidArgument)
	}
	return cb.Float32s(), nil
}

// plan splits ops into phases and fuses each RMSInv with the next phase's
// DX/DW of the same job when nothing else there touches its r.
func (b *Backend) plan(ops []compute.Op) (*plan, error) {
	phases := compute.Phases(ops)
	consumed := make([]map[int]bool, len(phases))
	for k := range phases {
		consumed[k] = map[int]bool{}
	}
	p := &plan{be: b, phases: make([][]*unit, len(phases))}
	var firstErr error
	mk := func(o *compute.Op) *unit {
		u := &unit{rows: o.Rows, dim: o.Dim}
		var err error
		get := func(buf compute.Buffer) []float32 {
			f, e := b.f32(buf)
			if e != nil && err == nil {
				err = e
			}
			return f
		}
		u.x, u.dy, u.w = get(o.X), get(o.DY), get(o.W)
		switch o.Kind {
		case compute.OpRMSInv:
			u.rOut, u.eps = get(o.R), o.Eps()
		case compute.OpDX:
			u.rIn, u.dx, u.eps = get(o.R), get(o.DX), o.Eps()
		case compute.OpDW:
			u.rIn, u.dw = get(o.R), get(o.DW)
		default:
			err = fmt.Errorf("cpu: op kind %d: %w", o.Kind, compute.ErrInvalidArgument)
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return u
	}
	users := compute.Users(phases)
	for k, ph := range phases {
		for i := range ph {
			o := &ph[i]
			if consumed[k][i] {
				continue
			}
			u := mk(o)
			if o.Kind == compute.OpRMSInv && k+1 < len(phases) && !b.noFuse {
				if dxi, dwi, ok := compute.Fusable(o, phases[k+1], users[k+1][o.R]); ok {
					// The fused unit runs in phase k+1, where r is first read.
					if dxi >= 0 {
						d := mk(&phases[k+1][dxi])
						u.w, u.dy, u.dx = d.w, d.dy, d.dx
						consumed[k+1][dxi] = true
					}
					if dwi >= 0 {
						d := mk(&phases[k+1][dwi])
						u.dy, u.dw = d.dy, d.dw
						consumed[k+1][dwi] = true
					}
					p.phases[k+1] = append(p.phases[k+1], u)
					continue
				}
			}
			p.phases[k] = append(p.phases[k], u)
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	for _, ph := range p.phases {
		for _, u := range ph {
			u.rb = rowBlock(u.dim)
			u.nblk = (u.rows + u.rb - 1) / u.rb
			u.nt = u.dx != nil && 4*len(u.dx) >= ntBytes
			if u.dw != nil && u.nblk > 1 {
				n := u.nblk * u.dim
				w := b.pool.get(n)
				p.parts = append(p.parts, w)
				u.part = w[:n]
			}
		}
	}
	return p, nil
}

type task struct {
	u      *unit
	lo, hi int // rows (row tasks) or features (reduce tasks)
	reduce bool
}

func (p *plan) run(ctx context.Context, threads int) error {
	var tasks []task
	for _, ph := range p.phases {
		tasks = tasks[:0]
		for _, u := range ph {
			for blk := 0; blk < u.nblk; blk++ {
				tasks = append(tasks, task{u: u, lo: blk * u.rb, hi: min(u.rows, (blk+1)*u.rb)})
			}
		}
		if err := p.runTasks(ctx, tasks, threads); err != nil {
			return err
		}
		tasks = tasks[:0]
		for _, u := range ph {
			if u.part == nil {
				continue
			}
			for f := 0; f < u.dim; f += reduceChunk {
				tasks = append(tasks, task{u: u, lo: f, hi: min(u.dim, f+reduceChunk), reduce: true})
			}
		}
		if err := p.runTasks(ctx, tasks, threads); err != nil {
			return err
		}
	}
	return nil
}

// runTasks runs tasks on up to threads goroutines, checking ctx between
// tasks. Which goroutine runs a task never changes what it computes.
func (p *plan) runTasks(ctx context.Context, tasks []task, threads int) error {
	if len(tasks) == 0 {
		return nil
	}
	pr := p.be.pr
	workers := min(threads, len(tasks))
	if workers <= 1 {
		sc := new(scratch)
		for i := range tasks {
			if err := ctx.Err(); err != nil {
				return err
			}
			tasks[i].do(pr, sc)
		}
		return nil
	}
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := new(scratch)
			for {
				i := int(next.Add(1) - 1)
				if i >= len(tasks) || failed.Load() {
					return
				}
				if ctx.Err() != nil {
					failed.Store(true)
					return
				}
				tasks[i].do(pr, sc)
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		return ctx.Err()
	}
	return nil
}

func (t *task) do(pr *prims, sc *scratch) {
	u := t.u
	if t.reduce {
		d := u.dim
		for i := t.lo; i < t.hi; i++ {
			v := u.part[i]
			for blk := 1; blk < u.nblk; blk++ {
				v += u.part[blk*d+i]
			}
			u.dw[i] = v
		}
		return
	}
	d := u.dim
	var part []float32
	if u.dw != nil {
		if u.part != nil {
			blk := t.lo / u.rb
			part = u.part[blk*d : (blk+1)*d]
		} else {
			part = u.dw
		}
		clear(part)
	}
	for b := t.lo; b < t.hi; b++ {
		x := u.x[b*d : (b+1)*d]
		var dy []float32
		if u.dy != nil {
			dy = u.dy[b*d : (b+1)*d]
		}
		var r, c float32
		switch {
		case u.rOut != nil && u.dx != nil:
			ss, s := pr.rowDots(x, dy, u.w, sc)
			r = rmsInv(ss, d, u.eps)
			c = dxCoef(s, r, d)
			u.rOut[b] = r
		case u.rOut != nil:
			r = rmsInv(pr.rowSumSq(x, sc), d, u.eps)
			u.rOut[b] = r
		default:
			r = u.rIn[b]
			if u.dx != nil {
				_, s := pr.rowDots(x, dy, u.w, sc)
				c = dxCoef(s, r, d)
			}
		}
		switch {
		case u.dx != nil && u.dw != nil:
			pr.dxdw(x, dy, u.w, u.dx[b*d:(b+1)*d], part, r, c, u.nt)
		case u.dx != nil:
			pr.dx(x, dy, u.w, u.dx[b*d:(b+1)*d], r, c, u.nt)
		case u.dw != nil:
			pr.dw(x, dy, part, r)
		}
		if d == 1 && u.dx != nil {
			// The general form cancels at dim 1 (compute.DXDim1).
			u.dx[b] = compute.DXDim1(dy[0], u.w[0], r, u.eps)
		}
	}
}
