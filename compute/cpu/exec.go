package cpu

import (
	"context"
	"fmt"
	"runtime/debug"
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

// tensor is one buffer's host memory as the kernels see it: f for F32, h
// (the elements' bits) for BF16 and F16. The zero tensor is "absent".
type tensor struct {
	dt compute.DType
	f  []float32
	h  []uint16
}

func (t *tensor) ok() bool { return t.dt != "" }

// row returns row b (of d elements) of an input tensor as float32s: the
// tensor's own memory for F32, else widened exactly into buf.
func (t *tensor) row(pr *prims, b, d int, buf []float32) []float32 {
	if t.dt == compute.F32 {
		return t.f[b*d : (b+1)*d]
	}
	buf = buf[:d]
	pr.widen(t.dt, buf, t.h[b*d:(b+1)*d])
	return buf
}

// unit is the work of one job's kernels in one phase: an RMSInv alone, a DX
// and/or DW reading r, or an RMSInv fused with the DX and/or DW after it.
// Inputs and outputs may be of any dtype; rows of half inputs are widened
// into float32 scratch as they are read, rows of half dx are computed in
// float32 scratch and rounded as they are stored, and dw is always summed
// in float32 partials and rounded by the reduction.
type unit struct {
	x, dy     tensor
	wIn       tensor    // w as given
	w         []float32 // w as float32: wIn's memory, or widened once per Execute
	rIn       []float32 // r to read (unfused DX/DW)
	rOut      []float32 // r to write (RMSInv, alone or fused)
	dx, dw    tensor    // outputs; absent when not computed
	rows, dim int
	eps       float32
	rb, nblk  int
	part      []float32 // nblk*dim float32 dw partials when nblk > 1 or dw is half
	nt        bool      // stream an F32 dx past the caches (see ntBytes)
}

// ntBytes is the dx size from which stores bypass the cache: beyond a
// few MiB dx cannot stay cached for its reader anyway, and a plain store
// would first read each line (read-for-ownership), a third more traffic.
const ntBytes = 4 << 20

type plan struct {
	be     *Backend
	phases [][]*unit
	parts  [][]float32 // pooled stores (dw partials, widened w) to release
}

func (p *plan) release() {
	for _, w := range p.parts {
		p.be.pool.put(w)
	}
	p.parts = nil
}

// view returns the host memory of a buffer of this backend.
func (b *Backend) view(buf compute.Buffer) (tensor, error) {
	if buf == nil {
		return tensor{}, nil
	}
	cb, ok := buf.(*buffer)
	if !ok || cb.be != b || cb.released {
		return tensor{}, fmt.Errorf("cpu: buffer %T is not a live buffer of this backend: %w", buf, compute.ErrInvalidArgument)
	}
	if cb.dtype == compute.F32 {
		return tensor{dt: cb.dtype, f: cb.Float32s()}, nil
	}
	return tensor{dt: cb.dtype, h: cb.halfs()}, nil
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
		get := func(buf compute.Buffer) tensor {
			t, e := b.view(buf)
			if e != nil && err == nil {
				err = e
			}
			return t
		}
		u.x, u.dy, u.wIn = get(o.X), get(o.DY), get(o.W)
		switch o.Kind {
		case compute.OpRMSInv:
			u.rOut, u.eps = get(o.R).f, o.Eps()
		case compute.OpDX:
			u.rIn, u.dx, u.eps = get(o.R).f, get(o.DX), o.Eps()
		case compute.OpDW:
			u.rIn, u.dw = get(o.R).f, get(o.DW)
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
						u.wIn, u.dy, u.dx = d.wIn, d.dy, d.dx
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
			u.nt = u.dx.dt == compute.F32 && 4*len(u.dx.f) >= ntBytes
			switch {
			case !u.wIn.ok():
			case u.wIn.dt == compute.F32:
				u.w = u.wIn.f
			default:
				w := b.pool.get(u.dim)
				p.parts = append(p.parts, w)
				u.w = w[:u.dim]
				b.pr.widen(u.wIn.dt, u.w, u.wIn.h)
			}
			if u.dw.ok() && (u.nblk > 1 || u.dw.dt != compute.F32) {
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

// getScratch returns a scratch from the backend's pool (a new one when
// the pool is empty).
func (b *Backend) getScratch() *scratch {
	if sc, ok := b.scratch.Get().(*scratch); ok {
		return sc
	}
	return new(scratch)
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
		sc := p.be.getScratch()
		defer p.be.scratch.Put(sc)
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
	var panicked atomic.Pointer[WorkerPanic]
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if x := recover(); x != nil {
					panicked.CompareAndSwap(nil, &WorkerPanic{Value: x, Stack: debug.Stack()})
					failed.Store(true)
				}
			}()
			sc := p.be.getScratch()
			defer p.be.scratch.Put(sc)
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
	if wp := panicked.Load(); wp != nil {
		panic(wp)
	}
	if failed.Load() {
		return ctx.Err()
	}
	return nil
}

// WorkerPanic is a panic on one of Execute's worker goroutines, raised
// again on Execute's caller's goroutine once the other workers stop: left
// on the worker it would end the process, where the caller (the jobs
// batcher) recovers it and fails only the job that raised it.
type WorkerPanic struct {
	Value any
	Stack []byte // the worker goroutine's, where it was raised
}

func (p *WorkerPanic) Error() string { return fmt.Sprintf("%v (on a cpu worker goroutine)", p.Value) }

// GoroutineStack is the stack where the panic was raised.
func (p *WorkerPanic) GoroutineStack() []byte { return p.Stack }

func (t *task) do(pr *prims, sc *scratch) {
	u := t.u
	if t.reduce {
		t.reduceDW(pr, sc)
		return
	}
	d := u.dim
	var part []float32
	if u.dw.ok() {
		if u.part != nil {
			blk := t.lo / u.rb
			part = u.part[blk*d : (blk+1)*d]
		} else {
			part = u.dw.f
		}
		clear(part)
	}
	if u.x.dt != compute.F32 || u.dy.dt != compute.F32 && u.dy.ok() || u.dx.dt != compute.F32 && u.dx.ok() {
		sc.grow(d)
	}
	for b := t.lo; b < t.hi; b++ {
		x := u.x.row(pr, b, d, sc.x)
		var dy []float32
		if u.dy.ok() {
			dy = u.dy.row(pr, b, d, sc.dy)
		}
		// r, and s = sum dy*w*x when dx is wanted, in the same lane order
		// fused or not, so the bits are too.
		var r, s float32
		switch {
		case u.rOut != nil && u.dx.ok():
			var ss float32
			ss, s = pr.rowDots(x, dy, u.w, sc)
			r = rmsInv(ss, d, u.eps)
			u.rOut[b] = r
		case u.rOut != nil:
			r = rmsInv(pr.rowSumSq(x, sc), d, u.eps)
			u.rOut[b] = r
		default:
			r = u.rIn[b]
			if u.dx.ok() {
				_, s = pr.rowDots(x, dy, u.w, sc)
			}
		}
		switch {
		case u.dx.ok():
			u.dxRow(pr, sc, b, x, dy, part, r, s)
		case u.dw.ok():
			pr.dw(x, dy, part, r)
		}
	}
}

// dxRow writes row b of dx (and adds the row's dw terms into part when dw
// is wanted) from the row's x, dy, r and s = sum dy*w*x. Every dx row of
// every dim and dtype is computed here, in float32, then rounded once
// when dx is half.
func (u *unit) dxRow(pr *prims, sc *scratch, b int, x, dy, part []float32, r, s float32) {
	d := u.dim
	c := dxCoef(s, r, d)
	var out []float32
	if u.dx.dt == compute.F32 {
		out = u.dx.f[b*d : (b+1)*d]
	} else {
		out = sc.o[:d]
	}
	if part != nil {
		pr.dxdw(x, dy, u.w, out, part, r, c, u.nt)
	} else {
		pr.dx(x, dy, u.w, out, r, c, u.nt)
	}
	if d == 1 {
		// The general form cancels at dim 1 (compute.DXDim1).
		out[0] = compute.DXDim1(dy[0], u.w[0], r, u.eps)
	}
	if u.dx.dt != compute.F32 {
		pr.narrow(u.dx.dt, u.dx.h[b*d:(b+1)*d], out)
	}
}

// reduceDW sums features t.lo..t.hi of the dw partials in block order and
// stores them in dw's dtype.
func (t *task) reduceDW(pr *prims, sc *scratch) {
	u := t.u
	d := u.dim
	out := u.dw.f
	if u.dw.dt != compute.F32 {
		sc.grow(t.hi - t.lo)
		out = sc.o[:t.hi-t.lo]
	} else {
		out = out[t.lo:t.hi]
	}
	for i := t.lo; i < t.hi; i++ {
		v := u.part[i]
		for blk := 1; blk < u.nblk; blk++ {
			v += u.part[blk*d+i]
		}
		out[i-t.lo] = v
	}
	if u.dw.dt != compute.F32 {
		pr.narrow(u.dw.dt, u.dw.h[t.lo:t.hi], out)
	}
}
