package cuda

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/shaders"
)

// jobEntry is the device layout of struct Job in shaders/rms_norm_backward.cu
// (96 bytes; TestJobEntryLayout pins it).
type jobEntry struct {
	x, w, dy, r, dx, part, dw uint64
	rows, dim, rg, g          int32
	flags                     int32
	eps                       float32
	start, rstart             int32
	stages                    int32
	types                     int32 // entry.types: the dtypes of x, w, dy, dx, dw and io
}

const jobEntrySize = int(unsafe.Sizeof(jobEntry{}))

// launchArgs holds kernel arguments in Go heap memory that does not move, and
// the pointer array cuLaunchKernel reads them through.
type launchArgs struct {
	table, bmap uint64
	a, b, c     uint64
	n           int64
	one         [1]unsafe.Pointer
	two         [2]unsafe.Pointer
	four        [4]unsafe.Pointer
	cfg         launchConfig // cuLaunchKernelEx's, with attr
	attr        launchAttr
}

// phaseLaunch is where one phase's table parts live and how many blocks its
// launches have: each rows kernel (kRows...) and the dw reduction.
type phaseLaunch struct {
	table, bmapRed int // byte offsets into the job table
	bmapRows       [nKernels]int
	rowBlocks      [nKernels]int
	redBlocks      int
	smem           int // dynamic shared memory of the kRows launch
}

// rowsKernels names the rows kernels and their block sizes, by kRows...
var rowsKernels = [nKernels]struct {
	name    string
	threads int
}{
	kRows:      {shaders.CUDARowsKernel, rowsThreads},
	kWide:      {shaders.CUDARowsWideKernel, wideThreads},
	kRowsFused: {shaders.CUDARowsFusedKernel, rowsThreads},
	kWideFused: {shaders.CUDARowsWideFusedKernel, wideThreads},
}

// Stats is what the last Execute measured with device events.
type Stats struct {
	Total   time.Duration // first upload to last download
	Kernels time.Duration // the launches alone
	Jobs    int           // job-table entries launched
	Uploads int           // bytes copied host to device (inputs and table)
	Downs   int           // bytes copied device to host
}

// LastStats returns the event timings of the last successful Execute.
func (b *Backend) LastStats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// own returns buf as a live buffer of this backend.
func (b *Backend) own(buf compute.Buffer) (*buffer, error) {
	x, ok := buf.(*buffer)
	if !ok || x.b != b {
		return nil, fmt.Errorf("cuda: buffer %T is not a buffer of this backend: %w", buf, compute.ErrInvalidArgument)
	}
	if x.released {
		return nil, fmt.Errorf("cuda: buffer %v was released: %w", x.shape, compute.ErrInvalidArgument)
	}
	return x, nil
}

// smemReserve is shared memory per block left to the system and the
// kernel's static arrays.
const smemReserve = 1024

// geometry picks, for a job of rows x dim, the kernel, the rows per group
// and the group count (persistent blocks, at most one wave), and the
// shared-memory row slots of rows_smem (0: the register paths). Measured on
// the H200 (docs/cuda.md, runs 4 and 5):
//   - dims up to 4096: each row and w in registers, 256-thread blocks, two
//     per SM (89% of the device copy at 16384x4096, 78% at 4096x4096);
//   - dims from 7172 to 8192 that are a multiple of 4 (4 chunks per thread of
//     512): the same in the wide kernel, 512 threads, one block per SM (93%
//     at 32768x8192; the slots path 91%);
//   - other multiples of 4 up to 8192: the shared-memory row slots, 256
//     threads, two blocks per SM, as many slots (up to 4) as half the shared
//     memory holds (84% at 16384x5120 and 86% at 16384x6144, where the wide
//     kernel, with 2.5 or 3 chunks per thread, measured 78% and 83%);
//   - the rest (not a multiple of 4, or over 8192): streaming, 256 threads.
//
// The kernel depends only on dim and the groups only on rows, dim and the
// device, so the sums do too. RMSGRAD_CUDA_STAGES=n (read at Open) takes the
// shared-memory path for every multiple of 4 up to 8192 with up to n slots,
// RMSGRAD_CUDA_BLOCKS_PER_SM forces the blocks per SM and
// RMSGRAD_CUDA_RG_ALIGN the groups' row alignment (0: none), for benchmark
// variants; RMSGRAD_CUDA_PDL=0 launches the dw reduction the ordinary way.
func (b *Backend) geometry(rows, dim int) (rg, g, stages int, wide bool) {
	sms := max(b.sms, 1)
	nch := (dim + 3) / 4
	maxStages := b.maxStages
	forced := maxStages > 0
	if !forced {
		maxStages = 4
	}
	var smem bool
	if dim%4 == 0 && b.smemOptin > 0 {
		switch {
		case forced:
			smem = nch <= rowsThreads*8
		case nch > wideThreads*7/2 && nch <= wideThreads*4:
			wide = true
		case nch > rowsThreads*4 && nch <= rowsThreads*8:
			smem = true
		}
	}
	perSM := 2
	if wide {
		perSM = 1
	}
	if b.perSM > 0 {
		perSM = b.perSM
	}
	rg, g = groups(rows, perSM*sms, b.rgAlign)
	if smem {
		perBlock := (int(b.smemOptin)+smemReserve)/perSM - 2*smemReserve
		stages = max(0, min(maxStages, perBlock/(8*dim), rg))
	}
	return rg, g, stages, wide
}

// Execute runs ops on the backend's stream: uploads of every input no earlier
// op writes (from the buffers' pinned host memory), the job table, then for
// each phase one launch of the rows kernel over all its entries and one of
// the dw reduction (stream order is the barrier between phases), downloads
// of every written buffer, and one synchronize. The time returned is the
// device time from the first upload to the last download.
func (b *Backend) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	return b.execute(ctx, ops, true)
}

// execute is Execute; transfers false leaves the buffers' device copies as
// they are (benchmarks of device-resident data).
func (b *Backend) execute(ctx context.Context, ops []compute.Op, transfers bool) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, fmt.Errorf("cuda: Execute after Close: %w", compute.ErrDevice)
	}
	p, err := planOps(ops, b.geometry, b.own)
	if err != nil {
		return 0, err
	}
	unlock, err := b.bindCtx()
	if err != nil {
		return 0, err
	}
	defer unlock()

	// Lay out the job table (all phases) and the dw partial scratch (the
	// largest phase's; phases run one after another on the stream).
	launches := b.launches[:0]
	off, scratch, nent := 0, 0, 0
	align := func(n int) int { return (n + 15) &^ 15 }
	for _, ph := range p.phases {
		var l phaseLaunch
		l.table = off
		off = align(off + len(ph)*jobEntrySize)
		ps := 0
		for i := range ph {
			e := &ph[i]
			l.rowBlocks[e.kernel()] += e.g
			l.smem = max(l.smem, e.smemBytes())
			l.redBlocks += e.redBlocks()
			if e.dw != nil {
				ps = align(ps + 4*e.g*e.dim)
			}
		}
		for k := range nKernels {
			l.bmapRows[k] = off
			off = align(off + 4*l.rowBlocks[k])
		}
		l.bmapRed = off
		off = align(off + 4*l.redBlocks)
		scratch = max(scratch, ps)
		nent += len(ph)
		launches = append(launches, l)
	}
	b.launches = launches
	if err := b.ensure(&b.table, off, true); err != nil {
		return 0, err
	}
	if err := b.ensure(&b.scratch, scratch, false); err != nil {
		return 0, err
	}

	if off == 0 {
		return 0, nil // nothing to run (only empty phases)
	}
	// Fill the table in pinned host memory.
	host := unsafe.Slice((*byte)(b.table.host), b.table.size)
	dev := func(x *buffer) uint64 {
		if x == nil {
			return 0
		}
		return x.m.dptr
	}
	for pi, ph := range p.phases {
		l := launches[pi]
		if len(ph) == 0 {
			continue
		}
		tab := unsafe.Slice((*jobEntry)(unsafe.Pointer(&host[l.table])), len(ph))
		var bms [nKernels][]int32
		for k := range nKernels {
			bms[k] = unsafe.Slice((*int32)(unsafe.Pointer(&host[l.bmapRows[k]])), l.rowBlocks[k])
		}
		var bmd []int32
		if l.redBlocks > 0 {
			bmd = unsafe.Slice((*int32)(unsafe.Pointer(&host[l.bmapRed])), l.redBlocks)
		}
		// start counts blocks of the launch an entry runs in.
		var starts [nKernels]int
		rstart, part := 0, 0
		for i := range ph {
			e := &ph[i]
			k := e.kernel()
			bm, start := bms[k], &starts[k]
			je := jobEntry{
				x: dev(e.x), w: dev(e.w), dy: dev(e.dy), r: dev(e.r), dx: dev(e.dx), dw: dev(e.dw),
				rows: int32(e.rows), dim: int32(e.dim), rg: int32(e.rg), g: int32(e.g),
				flags: e.flags(), eps: e.eps, start: int32(*start), rstart: int32(rstart),
				stages: int32(e.stages), types: e.types(),
			}
			if e.dw != nil {
				je.part = b.scratch.dptr + uint64(part)
				part = align(part + 4*e.g*e.dim)
			}
			tab[i] = je
			for k := 0; k < e.g; k++ {
				bm[*start+k] = int32(i)
			}
			*start += e.g
			for k := range e.redBlocks() {
				bmd[rstart+k] = int32(i)
			}
			rstart += e.redBlocks()
		}
	}

	d, s := b.d, b.stream
	st := Stats{Jobs: nent, Uploads: off}
	if err := b.spin(b.hold); err != nil {
		return 0, err
	}
	if err := d.check("cuEventRecord", d.cuEventRecord(b.evStart, s)); err != nil {
		return 0, err
	}
	if transfers {
		for _, x := range p.uploads {
			if err := d.check("cuMemcpyHtoDAsync", d.cuMemcpyHtoDAsync(x.m.dptr, x.m.host, uintptr(x.nbytes()), s)); err != nil {
				return 0, fmt.Errorf("cuda: uploading a %v buffer: %w", x.shape, err)
			}
			st.Uploads += x.nbytes()
		}
	}
	if off > 0 {
		if err := d.check("cuMemcpyHtoDAsync", d.cuMemcpyHtoDAsync(b.table.dptr, b.table.host, uintptr(off), s)); err != nil {
			return 0, fmt.Errorf("cuda: uploading the job table (%d bytes): %w", off, err)
		}
	}
	if err := d.check("cuEventRecord", d.cuEventRecord(b.evK0, s)); err != nil {
		return 0, err
	}
	for _, l := range launches {
		for k, rk := range rowsKernels {
			smem := 0
			if k == kRows {
				smem = l.smem
			}
			if err := b.launch(b.fnRows[k], rk.name, rk.threads, l.rowBlocks[k], smem, l.table, l.bmapRows[k], false); err != nil {
				return 0, err
			}
		}
		if err := b.launch(b.fnReduce, shaders.CUDAReduceKernel, rowsThreads, l.redBlocks, 0, l.table, l.bmapRed, b.pdl); err != nil {
			return 0, err
		}
	}
	if err := d.check("cuEventRecord", d.cuEventRecord(b.evK1, s)); err != nil {
		return 0, err
	}
	if transfers {
		for _, x := range p.downloads {
			if err := d.check("cuMemcpyDtoHAsync", d.cuMemcpyDtoHAsync(x.m.host, x.m.dptr, uintptr(x.nbytes()), s)); err != nil {
				return 0, fmt.Errorf("cuda: downloading a %v buffer: %w", x.shape, err)
			}
			st.Downs += x.nbytes()
		}
	}
	if err := d.check("cuEventRecord", d.cuEventRecord(b.evEnd, s)); err != nil {
		return 0, err
	}
	if err := d.check("cuStreamSynchronize", d.cuStreamSynchronize(s)); err != nil {
		return 0, fmt.Errorf("cuda: running %d job-table entries in %d phases: %w", nent, len(launches), err)
	}
	var ms, kms float32
	if err := d.check("cuEventElapsedTime", d.cuEventElapsedTime(&ms, b.evStart, b.evEnd)); err != nil {
		return 0, err
	}
	if err := d.check("cuEventElapsedTime", d.cuEventElapsedTime(&kms, b.evK0, b.evK1)); err != nil {
		return 0, err
	}
	st.Total = time.Duration(float64(ms) * float64(time.Millisecond))
	st.Kernels = time.Duration(float64(kms) * float64(time.Millisecond))
	b.last = st
	return st.Total, nil
}

// launch runs fn over blocks blocks of threads threads with smem bytes of
// dynamic shared memory, the job table at byte offset table and the block
// map at bmap; no-op for 0 blocks. dependent launches it as a programmatic
// dependent launch: it may be scheduled as the kernel before it in the
// stream drains, and waits for that kernel's results with
// griddepcontrol.wait before it reads anything (the reduce kernel does).
func (b *Backend) launch(fn uintptr, name string, threads, blocks, smem, table, bmap int, dependent bool) error {
	if blocks == 0 {
		return nil
	}
	a := b.args
	a.table = b.table.dptr + uint64(table)
	a.bmap = b.table.dptr + uint64(bmap)
	a.two = [2]unsafe.Pointer{unsafe.Pointer(&a.table), unsafe.Pointer(&a.bmap)}
	var r cuResult
	if dependent {
		a.attr = launchAttr{id: attrProgrammaticStreamSerialization}
		a.attr.value[0] = 1 // programmaticStreamSerializationAllowed, an int
		a.cfg = launchConfig{gridX: uint32(blocks), gridY: 1, gridZ: 1, blockX: uint32(threads), blockY: 1, blockZ: 1,
			sharedMem: uint32(smem), stream: b.stream, attrs: &a.attr, numAttrs: 1}
		r = b.d.cuLaunchKernelEx(&a.cfg, fn, unsafe.Pointer(&a.two[0]), nil)
	} else {
		r = b.d.cuLaunchKernel(fn, uint32(blocks), 1, 1, uint32(threads), 1, 1, uint32(smem), b.stream, unsafe.Pointer(&a.two[0]), nil)
	}
	if err := b.d.check("cuLaunchKernel("+name+")", r); err != nil {
		return fmt.Errorf("cuda: launching %s over %d blocks: %w", name, blocks, err)
	}
	return nil
}

// spin queues the blocking kernel for d (nothing for d <= 0).
func (b *Backend) spin(d time.Duration) error {
	if d <= 0 {
		return nil
	}
	a := b.args
	a.n = int64(d)
	a.one = [1]unsafe.Pointer{unsafe.Pointer(&a.n)}
	r := b.d.cuLaunchKernel(b.fnSpin, 1, 1, 1, 1, 1, 1, 0, b.stream, unsafe.Pointer(&a.one[0]), nil)
	return b.d.check("cuLaunchKernel("+shaders.CUDASpinKernel+")", r)
}

// ensure makes *m at least n bytes (device, and pinned host when withHost),
// reallocating only to grow; the stream is idle between Executes, so the old
// allocation can be freed at once.
func (b *Backend) ensure(m **mem, n int, withHost bool) error {
	if n == 0 || (*m != nil && (*m).size >= n) {
		return nil
	}
	nm, err := b.getMem(n, withHost)
	if err != nil {
		return err
	}
	b.freeMem(*m)
	*m = nm
	return nil
}
