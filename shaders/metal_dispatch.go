package shaders

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/rmsgrad/rmsgrad/compute"
)

// The kernel functions of rms_norm_backward.metal.
const (
	// MetalRowsKernel runs the row-wise work of one job (r, dx, dw
	// partials, as its flags say).
	MetalRowsKernel = "rms_norm_backward_rows_f32"
	// MetalReduceKernel sums a job's dw partials in a fixed order.
	MetalReduceKernel = "rms_norm_dw_reduce_f32"
)

// MetalKernels lists the functions a Metal backend builds pipelines for.
var MetalKernels = []string{MetalRowsKernel, MetalReduceKernel}

// Flags of the rows kernel (F_* in the .metal file).
const (
	MetalFlagComputeR = 1
	MetalFlagWriteR   = 2
	MetalFlagDX       = 4
	MetalFlagDW       = 8
	MetalFlagDWDirect = 16 // part is dw itself: one group, rounded once
)

// Element type codes (T_* in the .metal file).
const (
	MetalDTypeF32  = 0
	MetalDTypeBF16 = 1
	MetalDTypeF16  = 2
)

// Launch geometry. The thread count of a row's threadgroup and the number
// of row groups fix the summation order, so they are functions of the
// job's shape and of MetalDevice.MaxThreads only.
const (
	// MetalMinThreads is the smallest rows threadgroup: a multiple of every
	// SIMD width the kernels accept (8, 16, 32, 64).
	MetalMinThreads = 64
	// MetalMaxThreads is the largest rows threadgroup the plan asks for;
	// a device whose pipeline allows less gets its own power-of-two cap.
	MetalMaxThreads = 512
	// MetalTargetElems is the number of elements per thread the plan aims
	// for: T is the power of two nearest above dim/MetalTargetElems.
	MetalTargetElems = 8
	// MetalRegElems is the most elements per thread the rows kernel holds
	// in registers (RMS_REG_ELEMS); wider rows are read twice.
	MetalRegElems = 16
	// MetalMinGroupRows is the fewest rows of a row group when a job is
	// split into several: the dw partials then cost at most 12/16 bytes
	// per element (written, read, and the w read that goes with a group).
	MetalMinGroupRows = 16
	// MetalMaxGroups is the most row groups (threadgroups) of one job.
	MetalMaxGroups = 256
	// MetalReduceCols and MetalReduceSlices are the reduce kernel's
	// columns per threadgroup and group slices (RMS_RED_*).
	MetalReduceCols   = 32
	MetalReduceSlices = 8
	// MetalGeomBytes is the size of the kernels' rms_geom struct.
	MetalGeomBytes = 48
	// DefaultMaxCommandBytes bounds the memory traffic one command buffer
	// carries: 1 GiB is under 20 ms on the slowest Apple-silicon GPU
	// (68 GB/s), far from the seconds after which macOS may end a command
	// buffer (MTLCommandBufferErrorTimeout).
	DefaultMaxCommandBytes = 1 << 30
)

// MetalDevice is what a plan depends on besides the ops.
type MetalDevice struct {
	// SimdWidth is the pipelines' threadExecutionWidth: a power of two
	// from 8 to 64. The kernels read it at run time; the summation order
	// does not depend on it.
	SimdWidth int
	// MaxThreads caps the rows threadgroup: a power of two from
	// MetalMinThreads to MetalMaxThreads (0 means MetalMaxThreads).
	MaxThreads int
	// MaxCommandBytes bounds the traffic of one command buffer: larger
	// plans are split into several, committed one after the other
	// (0 means DefaultMaxCommandBytes).
	MaxCommandBytes int64
	// NoFuse plans every op as its own entry (tests: fused and unfused
	// must give the same bits).
	NoFuse bool
}

// CheckMetalDevice reports whether the kernels run correctly on a device
// with the given pipeline SIMD width and thread limit, and the device to
// plan with: the thread cap is the limit rounded down to a power of two,
// at most MetalMaxThreads. The error wraps compute.ErrUnsupported and
// names gpu and the offending value.
func CheckMetalDevice(gpu string, simdWidth, maxThreads int) (MetalDevice, error) {
	if simdWidth < 8 || simdWidth > 64 || simdWidth&(simdWidth-1) != 0 {
		return MetalDevice{}, fmt.Errorf("metal: %s: SIMD width %d: the kernels need a power of two from 8 to 64: %w", gpu, simdWidth, compute.ErrUnsupported)
	}
	if maxThreads < MetalMinThreads {
		return MetalDevice{}, fmt.Errorf("metal: %s: pipelines allow %d threads per threadgroup, the kernels need %d: %w", gpu, maxThreads, MetalMinThreads, compute.ErrUnsupported)
	}
	c := 1 << (bits.Len(uint(maxThreads)) - 1)
	return MetalDevice{SimdWidth: simdWidth, MaxThreads: min(c, MetalMaxThreads)}, nil
}

// RowThreads is the rows threadgroup size for dim: about
// dim/MetalTargetElems, a power of two from MetalMinThreads to maxThreads.
func RowThreads(dim, maxThreads int) int {
	if maxThreads <= 0 {
		maxThreads = MetalMaxThreads
	}
	want := (dim + MetalTargetElems - 1) / MetalTargetElems
	t := MetalMinThreads
	for t < want && t < maxThreads {
		t *= 2
	}
	return t
}

// RowGroups is the number of row groups (threadgroups) of a job of rows
// rows: one per MetalMinGroupRows rows, at most MetalMaxGroups.
func RowGroups(rows int) int { return min(max(rows/MetalMinGroupRows, 1), MetalMaxGroups) }

// BindKind says what a Binding binds.
type BindKind uint8

// Binding kinds.
const (
	// BindBuffer binds Buffer, an op's tensor.
	BindBuffer BindKind = iota
	// BindScratch binds the plan's scratch buffer number Scratch.
	BindScratch
	// BindBytes binds Bytes inline (setBytes on Metal).
	BindBytes
	// BindNone binds the backend's placeholder: an argument the flags leave
	// unused, which the kernel never touches (msl-cpu binds zero bytes, so a
	// touch faults).
	BindNone
)

// Binding is one [[buffer(Index)]] argument of a dispatch.
type Binding struct {
	Index   int
	Name    string // the kernel's argument name: "x", "geom", ...
	Kind    BindKind
	Buffer  compute.Buffer
	Scratch int
	Bytes   []byte
}

// Dispatch is one kernel launch exactly as a backend encodes it:
// dispatchThreadgroups(Threadgroups, Threads) with the bindings and the
// threadgroup memory lengths.
type Dispatch struct {
	Kernel       string
	Threadgroups [3]int // threadgroups per grid
	Threads      [3]int // threads per threadgroup
	// ThreadgroupMemory[i] is the byte length at [[threadgroup(i)]], a
	// multiple of 16 bytes as Metal requires.
	ThreadgroupMemory []int
	Bindings          []Binding // ascending Index
	// Bytes estimates the memory traffic of the dispatch, for splitting
	// plans into command buffers.
	Bytes int64
}

// TotalThreads is the number of threads of one threadgroup.
func (d *Dispatch) TotalThreads() int { return d.Threads[0] * d.Threads[1] * d.Threads[2] }

// StepKind says what a plan Step is.
type StepKind uint8

// Step kinds.
const (
	// StepDispatch encodes Dispatch.
	StepDispatch StepKind = iota
	// StepBarrier is a memory barrier over buffers: everything encoded
	// before completes, and its writes are visible, before anything after.
	StepBarrier
	// StepCommit ends the command buffer: commit it, wait for it, and
	// encode what follows into a new one (also a barrier).
	StepCommit
)

// Step is one entry of a MetalPlan.
type Step struct {
	Kind StepKind
	Dispatch
}

// MetalPlan is what Execute encodes for one op list.
type MetalPlan struct {
	Steps []Step
	// Scratch lists the byte lengths of the scratch buffers the plan's
	// BindScratch bindings refer to (f32 dw partials), each to be
	// allocated for the Execute and released after it.
	Scratch []int
}

// Commands is the number of command buffers the plan commits.
func (p *MetalPlan) Commands() int {
	n := 1
	for i := range p.Steps {
		if p.Steps[i].Kind == StepCommit {
			n++
		}
	}
	return n
}

// RoundThreadgroupMemory rounds a threadgroup memory length up to the
// multiple of 16 bytes that setThreadgroupMemoryLength:atIndex: requires.
func RoundThreadgroupMemory(n int) int { return (max(n, 1) + 15) &^ 15 }

// MetalDType is the kernels' code for a buffer's element type.
func MetalDType(d compute.DType) (uint32, error) {
	switch d {
	case compute.F32:
		return MetalDTypeF32, nil
	case compute.BF16:
		return MetalDTypeBF16, nil
	case compute.F16:
		return MetalDTypeF16, nil
	}
	return 0, fmt.Errorf("shaders: dtype %q has no Metal element type: %w", d, compute.ErrInvalidArgument)
}

// metalEntry is the row-wise work of one job in one phase: an RMSInv alone,
// a DX or a DW reading r, or an RMSInv fused with its job's DX and/or DW.
type metalEntry struct {
	x, w, dy, r, dx, dw compute.Buffer
	flags               uint32
	rows, dim           int
	eps                 float32
}

// PlanMetal turns validated ops into the steps of one or more command
// buffers. Phases (the ops between two barriers) stay phases; in each, an
// RMSInv whose r is read only by its job's DX and DW of the next phase
// (compute.Fusable) is fused with them into one rows dispatch; a job whose
// dw is summed over several row groups gets a reduce dispatch after a
// barrier. The geometry of a job depends only on its kind, shape and the
// device's MaxThreads, never on the rest of the batch, which is what makes
// results independent of batch composition; and RMSInv, DX and DW run the
// same kernel with the same geometry, so fused and unfused agree bit for
// bit.
func PlanMetal(ops []compute.Op, dev MetalDevice) (*MetalPlan, error) {
	if dev.MaxThreads == 0 {
		dev.MaxThreads = MetalMaxThreads
	}
	if dev.MaxCommandBytes <= 0 {
		dev.MaxCommandBytes = DefaultMaxCommandBytes
	}
	phases := compute.Phases(ops)
	users := compute.Users(phases)
	consumed := make([]map[int]bool, len(phases))
	for k := range phases {
		consumed[k] = map[int]bool{}
	}
	entries := make([][]metalEntry, len(phases))
	for k, ph := range phases {
		for i := range ph {
			if consumed[k][i] {
				continue
			}
			o := &ph[i]
			if o.Rows <= 0 || o.Dim <= 0 || o.Rows*o.Dim > compute.MaxElements {
				return nil, fmt.Errorf("shaders: plan %s: rows %d, dim %d: %w", o.Kernel(), o.Rows, o.Dim, compute.ErrInvalidArgument)
			}
			e := metalEntry{x: o.X, rows: o.Rows, dim: o.Dim, eps: o.Eps()}
			switch o.Kind {
			case compute.OpRMSInv:
				e.r, e.flags = o.R, MetalFlagComputeR|MetalFlagWriteR
				if k+1 < len(phases) && !dev.NoFuse {
					if dxi, dwi, ok := compute.Fusable(o, phases[k+1], users[k+1][o.R]); ok {
						// The fused entry runs in phase k+1, where r is
						// first read; it computes and writes r exactly as
						// the RMSInv alone would.
						if dxi >= 0 {
							d := &phases[k+1][dxi]
							e.w, e.dy, e.dx = d.W, d.DY, d.DX
							e.flags |= MetalFlagDX
							consumed[k+1][dxi] = true
						}
						if dwi >= 0 {
							d := &phases[k+1][dwi]
							e.dy, e.dw = d.DY, d.DW
							e.flags |= MetalFlagDW
							consumed[k+1][dwi] = true
						}
						entries[k+1] = append(entries[k+1], e)
						continue
					}
				}
			case compute.OpDX:
				e.w, e.dy, e.r, e.dx, e.flags = o.W, o.DY, o.R, o.DX, MetalFlagDX
			case compute.OpDW:
				e.dy, e.r, e.dw, e.flags = o.DY, o.R, o.DW, MetalFlagDW
			default:
				return nil, fmt.Errorf("shaders: plan: op kind %d has no kernel: %w", o.Kind, compute.ErrInvalidArgument)
			}
			entries[k] = append(entries[k], e)
		}
	}

	p := &MetalPlan{}
	var cur int64 // traffic of the command buffer being filled
	add := func(d Dispatch) {
		if cur > 0 && cur+d.Bytes > dev.MaxCommandBytes {
			p.Steps = append(p.Steps, Step{Kind: StepCommit})
			cur = 0
		}
		cur += d.Bytes
		p.Steps = append(p.Steps, Step{Kind: StepDispatch, Dispatch: d})
	}
	barrier := func() {
		if n := len(p.Steps); n > 0 && p.Steps[n-1].Kind == StepDispatch {
			p.Steps = append(p.Steps, Step{Kind: StepBarrier})
		}
	}
	for _, ph := range entries {
		var reduces []Dispatch
		for i := range ph {
			rows, red, err := p.planEntry(&ph[i], dev)
			if err != nil {
				return nil, err
			}
			for _, d := range rows {
				add(d)
			}
			if red != nil {
				reduces = append(reduces, *red)
			}
		}
		if len(reduces) > 0 {
			barrier()
			for _, d := range reduces {
				add(d)
			}
		}
		barrier()
	}
	if n := len(p.Steps); n > 0 && p.Steps[n-1].Kind == StepBarrier {
		p.Steps = p.Steps[:n-1]
	}
	return p, nil
}

// planEntry returns the rows dispatches of one entry (one, or several
// covering consecutive ranges of its groups when its traffic is over
// dev.MaxCommandBytes) and its reduce dispatch, if any.
func (p *MetalPlan) planEntry(e *metalEntry, dev MetalDevice) ([]Dispatch, *Dispatch, error) {
	var types [5]uint32 // x, w, dy, dx, dw
	var sizes [5]int
	for i, b := range [5]compute.Buffer{e.x, e.w, e.dy, e.dx, e.dw} {
		if b == nil {
			continue
		}
		t, err := MetalDType(b.DType())
		if err != nil {
			return nil, nil, err
		}
		types[i], sizes[i] = t, b.DType().Size()
	}
	t := RowThreads(e.dim, dev.MaxThreads)
	g := RowGroups(e.rows)
	regs := (e.dim+t-1)/t <= MetalRegElems
	doDW := e.flags&MetalFlagDW != 0
	flags := e.flags
	scratch := -1
	if doDW {
		if g == 1 && (regs || e.dw.DType() == compute.F32) {
			flags |= MetalFlagDWDirect
		} else {
			scratch = len(p.Scratch)
			p.Scratch = append(p.Scratch, 4*g*e.dim)
		}
	}
	geom := func(group0 int) []byte {
		b := make([]byte, MetalGeomBytes)
		le := binary.LittleEndian
		for i, v := range []uint32{uint32(e.rows), uint32(e.dim), uint32(g), uint32(group0), flags,
			math.Float32bits(e.eps), types[0], types[1], types[2], types[3], types[4], 0} {
			le.PutUint32(b[4*i:], v)
		}
		return b
	}
	buf := func(i int, name string, b compute.Buffer) Binding {
		if b == nil {
			return Binding{Index: i, Name: name, Kind: BindNone}
		}
		return Binding{Index: i, Name: name, Kind: BindBuffer, Buffer: b}
	}
	part := buf(5, "part", e.dw)
	if scratch >= 0 {
		part = Binding{Index: 5, Name: "part", Kind: BindScratch, Scratch: scratch}
	}

	// Traffic: per row, x (and dy, dx when used) and r; per group, w once
	// (cached after) and a partial row.
	perRow := int64(e.dim) * int64(sizes[0]+sizes[2]+sizes[3])
	perRow += 4
	perGroup := int64(e.dim) * int64(sizes[1])
	if doDW {
		perGroup += 4 * int64(e.dim)
	}
	rowsPerGroup := int64((e.rows + g - 1) / g)
	groupBytes := rowsPerGroup*perRow + perGroup
	chunk := g
	if groupBytes*int64(g) > dev.MaxCommandBytes {
		chunk = int(max(dev.MaxCommandBytes/groupBytes, 1))
	}
	var rows []Dispatch
	for g0 := 0; g0 < g; g0 += chunk {
		n := min(chunk, g-g0)
		rows = append(rows, Dispatch{
			Kernel:            MetalRowsKernel,
			Threadgroups:      [3]int{n, 1, 1},
			Threads:           [3]int{t, 1, 1},
			ThreadgroupMemory: []int{RoundThreadgroupMemory(4 * t)},
			Bindings: []Binding{
				buf(0, "x", e.x), buf(1, "w", e.w), buf(2, "dy", e.dy), buf(3, "r", e.r),
				buf(4, "dx", e.dx), part,
				{Index: 6, Name: "geom", Kind: BindBytes, Bytes: geom(g0)},
			},
			Bytes: int64(n) * groupBytes,
		})
	}
	if scratch < 0 {
		return rows, nil, nil
	}
	red := &Dispatch{
		Kernel:            MetalReduceKernel,
		Threadgroups:      [3]int{(e.dim + MetalReduceCols - 1) / MetalReduceCols, 1, 1},
		Threads:           [3]int{MetalReduceCols * MetalReduceSlices, 1, 1},
		ThreadgroupMemory: []int{RoundThreadgroupMemory(4 * MetalReduceCols * MetalReduceSlices)},
		Bindings: []Binding{
			{Index: 0, Name: "part", Kind: BindScratch, Scratch: scratch},
			buf(1, "dw", e.dw),
			{Index: 2, Name: "geom", Kind: BindBytes, Bytes: geom(0)},
		},
		Bytes: int64(g)*int64(e.dim)*4 + int64(e.dim)*int64(sizes[4]),
	}
	return rows, red, nil
}
