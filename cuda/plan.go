package cuda

import (
	"fmt"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/shaders"
)

// Job-table flags; the same values as F_* in shaders/rms_norm_backward.cu.
const (
	flagComputeR = 1
	flagWriteR   = 2
	flagDX       = 4
	flagDW       = 8
)

// Element type codes of the job entry's types word: the same values as
// T_F32, T_BF16, T_F16 and T_ANY in the .cu.
const (
	typeF32  = 0
	typeBF16 = 1
	typeF16  = 2
	typeAny  = 3 // io only: x, dy and dx do not share one dtype
)

// typeCode returns the code of a buffer's dtype (F32 for nil: absent
// tensors are never read).
func typeCode(b *buffer) int32 {
	if b == nil {
		return typeF32
	}
	switch b.dtype {
	case compute.BF16:
		return typeBF16
	case compute.F16:
		return typeF16
	}
	return typeF32
}

// Launch geometry; the same values as RMS_THREADS, RED_SL and RMS_RED_CH in
// the .cu.
const (
	rowsThreads = 256 // the general path's block for dims without a fused class
	redSlices   = 32  // partial slices of the reduce (its bits depend on them)
)

// redChunks is the 4-column chunks a reduce block sums (its threads:
// redSlices*redChunks): 8 unless RMSGRAD_CUDA_RED_CH (1, 2, 4 or 8, a
// benchmark knob) sets it at Open; any value gives the same bits.
var redChunks = 8

// entry is one row of a phase's job table before device pointers are known:
// the rows of one job with the work the flags name. An RMSInv fused with the
// DX and/or DW of the next phase is one entry (computeR, writeR, dx, dw).
type entry struct {
	x, w, dy, r, dx, dw *buffer
	computeR, writeR    bool
	rows, dim           int
	eps                 float32
	geom
}

// Rows kernels (shaders.CUDARowsKernel, the fused classes'
// shaders.CUDARowsFusedKernels and the half classes' F16 kernels,
// shaders.CUDARowsFusedF16Kernels), by index: launches are per kernel and
// block size.
const (
	kRows     = 0                           // the general path: any flags, dtypes and dims
	kFused0   = 1                           // fused class c is kernel kFused0 + c (BF16 for a half class)
	kFusedF16 = kFused0 + len(fusedClasses) // half class c's F16 kernel is kFusedF16 + c - firstHalfClass
	nKernels  = kFusedF16 + len(fusedClasses) - firstHalfClass
)

// kernelClass is the fused class of rows kernel k, -1 for the general one.
func kernelClass(k int) int {
	switch {
	case k >= kFusedF16:
		return firstHalfClass + k - kFusedF16
	case k >= kFused0:
		return k - kFused0
	}
	return -1
}

// fusedKernelName is the entry point of rows kernel k >= kFused0.
func fusedKernelName(k int) string {
	if k >= kFusedF16 {
		return shaders.CUDARowsFusedF16Kernels[k-kFusedF16]
	}
	return shaders.CUDARowsFusedKernels[k-kFused0]
}

// classKernels are the rows kernels of fused class c: one, or a half
// class's BF16 and F16 kernels.
func classKernels(c int) []int {
	if c >= firstHalfClass {
		return []int{kFused0 + c, kFusedF16 + c - firstHalfClass}
	}
	return []int{kFused0 + c}
}

// io is the dtype code x, dy and dx share (those the entry reads or
// writes), the type the rows code is compiled for, or typeAny when they
// differ.
func (e *entry) io() int32 {
	x := typeCode(e.x)
	if e.dy != nil && typeCode(e.dy) != x || e.dx != nil && typeCode(e.dx) != x {
		return typeAny
	}
	return x
}

// types is the entry's types word: 2 bits each for x, w, dy, dx, dw and
// io, as the .cu's TYPE_* macros read it.
func (e *entry) types() int32 {
	return typeCode(e.x) | typeCode(e.w)<<2 | typeCode(e.dy)<<4 | typeCode(e.dx)<<6 | typeCode(e.dw)<<8 | e.io()<<10
}

// halfXY reports whether x or dy is not F32: such entries get no
// shared-memory row slots (rows_smem copies F32 rows).
func (e *entry) halfXY() bool {
	return e.x != nil && e.x.dtype != compute.F32 || e.dy != nil && e.dy.dtype != compute.F32
}

// kernel is the rows kernel the entry runs in: its dim's fused class when
// every flag is set, no shared-memory slots are used and x, dy and dx share
// a dtype (a half class's kernel of that dtype), else the general kernel.
// All run with the block size of the entry's geometry and the same
// arithmetic in the same order, so an entry's bits do not depend on which
// it takes.
func (e *entry) kernel() int {
	if e.class >= 0 && e.computeR && e.writeR && e.dx != nil && e.dw != nil && e.stages == 0 {
		switch io := e.io(); {
		case io == typeAny:
		case io == typeF16 && e.class >= firstHalfClass:
			return kFusedF16 + e.class - firstHalfClass
		default:
			return kFused0 + e.class
		}
	}
	return kRows
}

// geom is where a job's rows run: rows per group and groups (blocks),
// shared-memory row slots (rows_smem; 0: registers or streaming), the
// block size, and the fused class of its dim (-1: none).
type geom struct {
	rg, g, stages, threads, class int
}

// geomFunc gives a job's geometry for rows in chunks of cw elements
// (rowsCW of x's dtype). It must depend only on rows, dim, cw and the
// device, so the dw summation order is fixed per shape; the block size
// must depend on dim and cw alone, so the row sums of an RMSInv, a DX and a
// DW of the same job run in the same order.
type geomFunc func(rows, dim, cw int) geom

func (e *entry) flags() int32 {
	var f int32
	if e.computeR {
		f |= flagComputeR
	}
	if e.writeR {
		f |= flagWriteR
	}
	if e.dx != nil {
		f |= flagDX
	}
	if e.dw != nil {
		f |= flagDW
	}
	return f
}

// place sets the entry's geometry from geom, with no shared-memory slots
// for half x or dy.
func (e *entry) place(geom geomFunc) {
	e.geom = geom(e.rows, e.dim, rowsCW(typeCode(e.x)))
	if e.halfXY() {
		e.stages = 0
	}
}

// redBlocks is the number of reduce blocks of a DW entry (0 otherwise, and
// for a job in one group, which stores dw itself).
func (e *entry) redBlocks() int {
	if e.dw == nil || e.g <= 1 {
		return 0
	}
	nch := (e.dim + 3) / 4
	return (nch + redChunks - 1) / redChunks
}

// execPlan is what Execute does for one op list: the buffers to upload
// (inputs not written earlier in the list), the entries of each phase (one
// rows launch and at most one reduce launch per phase) and the buffers to
// download (everything written).
type execPlan struct {
	uploads   []*buffer
	phases    [][]entry
	downloads []*buffer
}

// groups returns the rows per group and the group count for a job of rows
// x dim when at most gmax groups are wanted. It depends only on rows, dim,
// gmax and align (fixed per device), so the dw summation order does too.
//
// With align > 1 the rows per group are rounded up to a multiple of align
// when that adds at most 2% to them: fewer, evenly sized groups. On the
// H200, 16384 rows in 256 groups of 64 beat 261 groups of 63 by 1-3 us
// (docs/cuda.md, run 9).
//
// A small job (under smallJobElems elements) gets groups of at least
// minGroupElems elements (whole rows): one block, or a few, so a batch of
// them is one launch with about a block per job, and a job in one group
// stores dw itself (no partials, no reduce launch). Larger jobs keep the
// whole device (a 1000x257 job in groups of 32 rows took 2.8 times as long
// as in groups of 4 on the H200).
func groups(rows, dim, gmax, align int) (rg, g int) {
	rg = (rows + gmax - 1) / gmax
	if align > 1 {
		if ra := (rg + align - 1) / align * align; (ra-rg)*50 <= rg {
			rg = ra
		}
	}
	if m := (minGroupElems + dim - 1) / max(dim, 1); rows*dim < smallJobElems && rg < m {
		rg = m
	}
	rg = max(1, min(rg, rows))
	return rg, (rows + rg - 1) / rg
}

// minGroupElems is the fewest elements a row group of a small job holds
// (groups): 8 rows of 1024; smallJobElems is where a job stops being small.
const (
	minGroupElems = 8192
	smallJobElems = 1 << 17
)

// defaultRGAlign is the backend's groups alignment (RMSGRAD_CUDA_RG_ALIGN
// overrides it).
const defaultRGAlign = 8

// planOps turns validated ops into an execPlan. own maps a compute.Buffer to
// this backend's *buffer (an error for a foreign or released one); geom
// splits each job's rows into groups (blocks).
func planOps(ops []compute.Op, geom geomFunc, own func(compute.Buffer) (*buffer, error)) (*execPlan, error) {
	phases := compute.Phases(ops)
	p := &execPlan{phases: make([][]entry, len(phases))}

	// Transfers: an input is uploaded unless an earlier op wrote it; every
	// output is downloaded, in first-write order.
	// seen: 1 written, 2 uploaded (one map, sized for the batch: the host
	// side of a batch of small jobs is mostly this planning).
	const wrote, upl = 1, 2
	seen := make(map[compute.Buffer]uint8, 4*len(ops))
	var firstErr error
	get := func(buf compute.Buffer) *buffer {
		if buf == nil {
			return nil
		}
		b, err := own(buf)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return b
	}
	for _, ph := range phases {
		for i := range ph {
			o := &ph[i]
			var in [4]compute.Buffer
			var out compute.Buffer
			switch o.Kind {
			case compute.OpRMSInv:
				in, out = [4]compute.Buffer{o.X}, o.R
			case compute.OpDX:
				in, out = [4]compute.Buffer{o.X, o.W, o.DY, o.R}, o.DX
			case compute.OpDW:
				in, out = [4]compute.Buffer{o.X, o.DY, o.R}, o.DW
			default:
				return nil, fmt.Errorf("cuda: op kind %d: %w", o.Kind, compute.ErrInvalidArgument)
			}
			for _, buf := range in {
				if buf != nil && seen[buf] == 0 {
					seen[buf] = upl
					if b := get(buf); b != nil {
						p.uploads = append(p.uploads, b)
					}
				}
			}
			if seen[out]&wrote == 0 {
				seen[out] |= wrote
				if b := get(out); b != nil {
					p.downloads = append(p.downloads, b)
				}
			}
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}

	users := rUsers(phases)
	consumed := make([][]bool, len(phases))
	for k, ph := range phases {
		consumed[k] = make([]bool, len(ph))
	}
	for k, ph := range phases {
		for i := range ph {
			if consumed[k][i] {
				continue
			}
			o := &ph[i]
			e := entry{x: get(o.X), rows: o.Rows, dim: o.Dim}
			switch o.Kind {
			case compute.OpRMSInv:
				e.r, e.computeR, e.writeR, e.eps = get(o.R), true, true, o.Eps()
				if k+1 < len(phases) {
					if dxi, dwi, ok := compute.Fusable(o, phases[k+1], users[k+1][o.R]); ok {
						// The fused entry runs in phase k+1, where r is
						// first read; it computes r exactly as the RMSInv
						// alone would and still writes it.
						if dxi >= 0 {
							d := &phases[k+1][dxi]
							e.w, e.dy, e.dx = get(d.W), get(d.DY), get(d.DX)
							consumed[k+1][dxi] = true
						}
						if dwi >= 0 {
							d := &phases[k+1][dwi]
							e.dy, e.dw = get(d.DY), get(d.DW)
							consumed[k+1][dwi] = true
						}
						e.place(geom)
						p.phases[k+1] = append(p.phases[k+1], e)
						continue
					}
				}
			case compute.OpDX:
				e.w, e.dy, e.r, e.dx, e.eps = get(o.W), get(o.DY), get(o.R), get(o.DX), o.Eps()
			case compute.OpDW:
				e.dy, e.r, e.dw = get(o.DY), get(o.R), get(o.DW)
			}
			e.place(geom)
			p.phases[k] = append(p.phases[k], e)
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return p, nil
}

// rUsers maps, for each phase after the first, the r buffer of every
// RMSInv of the phase before to the indices of the ops of this phase that
// touch it (compute.Users restricted to what compute.Fusable is asked
// about, which costs a fraction of indexing every buffer).
func rUsers(phases [][]compute.Op) []map[compute.Buffer][]int {
	users := make([]map[compute.Buffer][]int, len(phases))
	for k := 1; k < len(phases); k++ {
		m := map[compute.Buffer][]int{}
		for i := range phases[k-1] {
			if o := &phases[k-1][i]; o.Kind == compute.OpRMSInv && o.R != nil {
				m[o.R] = nil
			}
		}
		if len(m) == 0 {
			continue
		}
		for i := range phases[k] {
			o := &phases[k][i]
			for _, buf := range [...]compute.Buffer{o.X, o.W, o.DY, o.R, o.DX, o.DW} {
				if buf == nil {
					continue
				}
				if l, ok := m[buf]; ok && (len(l) == 0 || l[len(l)-1] != i) {
					m[buf] = append(l, i)
				}
			}
		}
		users[k] = m
	}
	return users
}
