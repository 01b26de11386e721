package shaders

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/rmsgrad/rmsgrad/compute"
)

// Launch-geometry constants shared by rms_norm_backward.metal and MetalPlan.
const (
	// SimdWidth is the simdgroup width the kernels are written for (every
	// Apple GPU family runs 32-wide simdgroups); threadgroups are whole
	// simdgroups.
	SimdWidth = 32
	// MaxThreads is the largest threadgroup MetalPlan asks for. 256 is below
	// every Apple GPU's pipeline limit for these small kernels and keeps
	// enough threadgroups resident per core.
	MaxThreads = 256
	// DWTile is the number of consecutive features one dw threadgroup owns
	// (one per simdgroup lane).
	DWTile = SimdWidth
	// DWMaxRowLanes is the most simdgroups (row lanes) of one dw threadgroup.
	DWMaxRowLanes = MaxThreads / SimdWidth
	// GeomBytes is the size of the kernels' rms_geom struct (4 x uint32).
	GeomBytes = 16
)

// Binding is one [[buffer(Index)]] argument of a dispatch: either a tensor
// (Buffer) or small constant data bound inline (Bytes, setBytes on Metal).
type Binding struct {
	Index  int
	Name   string         // the kernel's argument name: "x", "params", ...
	Buffer compute.Buffer // nil when Bytes is set
	Bytes  []byte
}

// Dispatch is one kernel launch exactly as a backend encodes it:
// dispatchThreadgroups(Threadgroups, Threads) with the bindings and the
// threadgroup memory lengths.
type Dispatch struct {
	Kernel       compute.Kernel
	Threadgroups [3]int // threadgroups per grid
	Threads      [3]int // threads per threadgroup, a multiple of SimdWidth
	// ThreadgroupMemory[i] is the byte length at [[threadgroup(i)]], rounded
	// up to 16 bytes as Metal requires.
	ThreadgroupMemory []int
	Bindings          []Binding // ascending Index
}

// TotalThreads is the number of threads of one threadgroup.
func (d *Dispatch) TotalThreads() int { return d.Threads[0] * d.Threads[1] * d.Threads[2] }

// RoundThreadgroupMemory rounds a threadgroup memory length up to the
// multiple of 16 bytes that setThreadgroupMemoryLength:atIndex: requires.
func RoundThreadgroupMemory(n int) int { return (n + 15) &^ 15 }

// RowThreads is the threadgroup size of the per-row kernels (rms_inv, dx):
// dim rounded up to whole simdgroups, at least one and at most MaxThreads.
// Each thread strides the row by this many elements.
func RowThreads(dim int) int {
	t := (dim + SimdWidth - 1) / SimdWidth * SimdWidth
	return min(max(t, SimdWidth), MaxThreads)
}

// DWRowLanes is the number of simdgroups (row lanes) of a dw threadgroup:
// one per row up to DWMaxRowLanes.
func DWRowLanes(rows int) int { return min(max(rows, 1), DWMaxRowLanes) }

// MetalPlan returns the dispatch of one validated op (RMSInv, DX or DW). It is
// the single source of launch geometry for the Metal and msl-cpu backends, so
// the CPU run of the shader exercises the geometry a Mac would use. It
// depends only on the op's kind, rows and dim, never on the rest of a batch,
// which is what makes results independent of batch composition.
func MetalPlan(op *compute.Op) (Dispatch, error) {
	rows, dim := op.Rows, op.Dim
	if rows <= 0 || dim <= 0 || compute.NumElements([]int{rows, dim}) < 0 || rows*dim > compute.MaxElements {
		return Dispatch{}, fmt.Errorf("shaders: plan %s: rows %d, dim %d: %w", op.Kernel(), rows, dim, compute.ErrInvalidArgument)
	}
	params := make([]byte, 8)
	binary.LittleEndian.PutUint32(params[0:], math.Float32bits(op.Params[0]))
	binary.LittleEndian.PutUint32(params[4:], math.Float32bits(op.Params[1]))
	geom := make([]byte, GeomBytes)
	binary.LittleEndian.PutUint32(geom[0:], uint32(rows))
	binary.LittleEndian.PutUint32(geom[4:], uint32(dim))

	switch op.Kind {
	case compute.OpRMSInv:
		t := RowThreads(dim)
		return Dispatch{
			Kernel:            compute.KernelRMSInv,
			Threadgroups:      [3]int{rows, 1, 1},
			Threads:           [3]int{t, 1, 1},
			ThreadgroupMemory: []int{RoundThreadgroupMemory(4 * t / SimdWidth)},
			Bindings: []Binding{
				{Index: 0, Name: "x", Buffer: op.X},
				{Index: 1, Name: "r", Buffer: op.R},
				{Index: 2, Name: "params", Bytes: params},
				{Index: 3, Name: "geom", Bytes: geom},
			},
		}, nil
	case compute.OpDX:
		t := RowThreads(dim)
		return Dispatch{
			Kernel:            compute.KernelDX,
			Threadgroups:      [3]int{rows, 1, 1},
			Threads:           [3]int{t, 1, 1},
			ThreadgroupMemory: []int{RoundThreadgroupMemory(4 * t / SimdWidth)},
			Bindings: []Binding{
				{Index: 0, Name: "x", Buffer: op.X},
				{Index: 1, Name: "w", Buffer: op.W},
				{Index: 2, Name: "dy", Buffer: op.DY},
				{Index: 3, Name: "r", Buffer: op.R},
				{Index: 4, Name: "dx", Buffer: op.DX},
				{Index: 5, Name: "params", Bytes: params},
				{Index: 6, Name: "geom", Bytes: geom},
			},
		}, nil
	case compute.OpDW:
		lanes := DWRowLanes(rows)
		return Dispatch{
			Kernel:            compute.KernelDW,
			Threadgroups:      [3]int{(dim + DWTile - 1) / DWTile, 1, 1},
			Threads:           [3]int{lanes * SimdWidth, 1, 1},
			ThreadgroupMemory: []int{RoundThreadgroupMemory(4 * lanes * DWTile)},
			Bindings: []Binding{
				{Index: 0, Name: "x", Buffer: op.X},
				{Index: 1, Name: "dy", Buffer: op.DY},
				{Index: 2, Name: "r", Buffer: op.R},
				{Index: 3, Name: "dw", Buffer: op.DW},
				{Index: 4, Name: "params", Bytes: params},
				{Index: 5, Name: "geom", Bytes: geom},
			},
		}, nil
	}
	return Dispatch{}, fmt.Errorf("shaders: plan: op kind %d has no kernel: %w", op.Kind, compute.ErrInvalidArgument)
}
