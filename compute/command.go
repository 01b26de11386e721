package compute

import (
	"context"
	"fmt"
	"math"
)

// MaxElements is the largest element count of one tensor. The GPU kernels
// index with 32-bit integers, so rows*dim must stay below 2^31.
const MaxElements = math.MaxInt32

// CommandBuffer records validated dispatches and barriers for one Backend and
// runs them all with one Commit. It is not safe for concurrent use.
type CommandBuffer struct {
	b         Backend
	ops       []Op
	written   map[Buffer]Kernel // buffers written since the last barrier
	committed bool
}

// NewCommandBuffer returns an empty command buffer for b.
func NewCommandBuffer(b Backend) *CommandBuffer {
	return &CommandBuffer{b: b, written: make(map[Buffer]Kernel)}
}

// Reset empties c so it can record again, keeping its allocations.
func (c *CommandBuffer) Reset() {
	c.ops = c.ops[:0]
	clear(c.written)
	c.committed = false
}

// Ops returns the recorded ops (for tests and metrics).
func (c *CommandBuffer) Ops() []Op { return c.ops }

// RMSInvParams returns the params of KernelRMSInv: [eps, dim].
func RMSInvParams(eps float32, dim int) []float32 { return []float32{eps, float32(dim)} }

// DXParams returns the params of KernelDX: [dim, eps]. eps is the epsilon
// r was computed with; dx of dim 1 needs it (see DXDim1).
func DXParams(dim int, eps float32) []float32 { return []float32{float32(dim), eps} }

// DWParams returns the params of KernelDW: [dim, rows].
func DWParams(dim, rows int) []float32 { return []float32{float32(dim), float32(rows)} }

// RMSInv records r[rows] = rsqrt(mean(x[b,:]^2) + eps); params is [eps, dim].
// x may be F32, BF16 or F16; r must be F32.
func (c *CommandBuffer) RMSInv(x, r Buffer, params []float32, rows, dim int) error {
	k := KernelRMSInv
	if err := c.check(k, rows, dim, params); err != nil {
		return err
	}
	if err := checkBuf(k, "x", x, rows*dim, "rows*dim"); err != nil {
		return err
	}
	if err := checkBuf(k, "r", r, rows, "rows"); err != nil {
		return err
	}
	eps := params[0]
	if !(eps > 0) || math.IsInf(float64(eps), 0) {
		return argErr(k, "params[0] (eps)", "finite and > 0", eps)
	}
	if params[1] != float32(dim) {
		return argErr(k, "params[1] (dim)", fmt.Sprint(float32(dim)), params[1])
	}
	if err := c.checkAlias(k, []namedBuf{{"x", x}}, []namedBuf{{"r", r}}); err != nil {
		return err
	}
	c.record(Op{Kind: OpRMSInv, X: x, R: r, Rows: rows, Dim: dim, Params: [2]float32{params[0], params[1]}})
	return nil
}

// DX records dx[rows, dim] from x, w, dy and r; params is [dim, eps]. x, w,
// dy and dx may each be F32, BF16 or F16 (dx gets the float32 result
// rounded once to its dtype); r must be F32.
func (c *CommandBuffer) DX(x, w, dy, r, dx Buffer, params []float32, rows, dim int) error {
	k := KernelDX
	if err := c.check(k, rows, dim, params); err != nil {
		return err
	}
	for _, nb := range []namedBuf{{"x", x}, {"dy", dy}, {"dx", dx}} {
		if err := checkBuf(k, nb.name, nb.b, rows*dim, "rows*dim"); err != nil {
			return err
		}
	}
	if err := checkBuf(k, "w", w, dim, "dim"); err != nil {
		return err
	}
	if err := checkBuf(k, "r", r, rows, "rows"); err != nil {
		return err
	}
	if params[0] != float32(dim) {
		return argErr(k, "params[0] (dim)", fmt.Sprint(float32(dim)), params[0])
	}
	if eps := params[1]; !(eps > 0) || math.IsInf(float64(eps), 0) {
		return argErr(k, "params[1] (eps)", "finite and > 0", eps)
	}
	if err := c.checkAlias(k, []namedBuf{{"x", x}, {"w", w}, {"dy", dy}, {"r", r}}, []namedBuf{{"dx", dx}}); err != nil {
		return err
	}
	c.record(Op{Kind: OpDX, X: x, W: w, DY: dy, R: r, DX: dx, Rows: rows, Dim: dim, Params: [2]float32{params[0], params[1]}})
	return nil
}

// DW records dw[dim] = sum_b dy[b,:]*x[b,:]*r[b]; params is [dim, rows]. x,
// dy and dw may each be F32, BF16 or F16 (dw is summed in float32 and
// rounded once to its dtype); r must be F32.
func (c *CommandBuffer) DW(x, dy, r, dw Buffer, params []float32, rows, dim int) error {
	k := KernelDW
	if err := c.check(k, rows, dim, params); err != nil {
		return err
	}
	for _, nb := range []namedBuf{{"x", x}, {"dy", dy}} {
		if err := checkBuf(k, nb.name, nb.b, rows*dim, "rows*dim"); err != nil {
			return err
		}
	}
	if err := checkBuf(k, "r", r, rows, "rows"); err != nil {
		return err
	}
	if err := checkBuf(k, "dw", dw, dim, "dim"); err != nil {
		return err
	}
	if params[0] != float32(dim) {
		return argErr(k, "params[0] (dim)", fmt.Sprint(float32(dim)), params[0])
	}
	if params[1] != float32(rows) {
		return argErr(k, "params[1] (rows)", fmt.Sprint(float32(rows)), params[1])
	}
	if err := c.checkAlias(k, []namedBuf{{"x", x}, {"dy", dy}, {"r", r}}, []namedBuf{{"dw", dw}}); err != nil {
		return err
	}
	c.record(Op{Kind: OpDW, X: x, DY: dy, R: r, DW: dw, Rows: rows, Dim: dim, Params: [2]float32{params[0], params[1]}})
	return nil
}

// Barrier records a memory barrier: every dispatch before it completes, and
// its writes are visible, before any dispatch after it starts.
func (c *CommandBuffer) Barrier() {
	if n := len(c.ops); n == 0 || c.ops[n-1].Kind == OpBarrier {
		return
	}
	c.ops = append(c.ops, Op{Kind: OpBarrier})
	clear(c.written)
}

// Commit runs the recorded work on the backend and waits for it. A command
// buffer can be committed once (until Reset).
func (c *CommandBuffer) Commit(ctx context.Context) (Timing, error) {
	if c.committed {
		return Timing{}, ErrCommitted
	}
	c.committed = true
	if len(c.ops) == 0 {
		return Timing{}, nil
	}
	if err := ctx.Err(); err != nil {
		return Timing{}, err
	}
	d, err := c.b.Execute(ctx, c.ops)
	return Timing{Device: d}, err
}

type namedBuf struct {
	name string
	b    Buffer
}

func (c *CommandBuffer) record(op Op) {
	switch op.Kind {
	case OpRMSInv:
		c.written[op.R] = KernelRMSInv
	case OpDX:
		c.written[op.DX] = KernelDX
	case OpDW:
		c.written[op.DW] = KernelDW
	}
	c.ops = append(c.ops, op)
}

func (c *CommandBuffer) check(k Kernel, rows, dim int, params []float32) error {
	if c.committed {
		return fmt.Errorf("%s: %w", k, ErrCommitted)
	}
	if rows <= 0 {
		return argErr(k, "rows", "> 0", rows)
	}
	if dim <= 0 {
		return argErr(k, "dim", "> 0", dim)
	}
	if n := NumElements([]int{rows, dim}); n < 0 || n > MaxElements {
		return argErr(k, "rows*dim", fmt.Sprintf("<= %d", MaxElements), fmt.Sprintf("%d*%d (overflow)", rows, dim))
	}
	if len(params) < 2 {
		return argErr(k, "params", "2 f32 values (8 bytes)", fmt.Sprintf("%d values (%d bytes)", len(params), 4*len(params)))
	}
	return nil
}

// checkBuf checks a buffer's presence, dtype and element count. r must be
// F32; every other tensor may be any of DTypes.
func checkBuf(k Kernel, name string, b Buffer, want int, wantExpr string) error {
	if b == nil {
		return argErr(k, name, "a buffer", "nil")
	}
	if dt := b.DType(); name == "r" && dt != F32 {
		return argErr(k, name+" dtype", "F32 (r is always float32)", dt)
	} else if !dt.Valid() {
		return argErr(k, name+" dtype", "one of F32, BF16, F16", dt)
	}
	if b.Len() != want {
		return argErr(k, name+" element count", fmt.Sprintf("%s = %d", wantExpr, want), b.Len())
	}
	return nil
}

// checkAlias rejects an output that is also an input, and an input that a
// dispatch since the last barrier writes (a missing barrier).
func (c *CommandBuffer) checkAlias(k Kernel, in, out []namedBuf) error {
	for _, o := range out {
		for _, i := range in {
			if o.b == i.b {
				return argErr(k, o.name, "a buffer distinct from "+i.name, "the same buffer")
			}
		}
		if w, ok := c.written[o.b]; ok {
			return argErr(k, o.name, "a buffer no other dispatch since the last barrier writes", "written by "+string(w))
		}
	}
	for _, i := range in {
		if w, ok := c.written[i.b]; ok {
			return argErr(k, i.name, "a buffer written before the last barrier", "written by "+string(w)+" with no barrier in between")
		}
	}
	return nil
}
