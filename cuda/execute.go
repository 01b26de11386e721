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

// rowsLaunch is one launch of a rows kernel in a phase: every entry of the
// phase that runs in that kernel with that block size.
type rowsLaunch struct {
	kernel, threads int
	blocks          int
	bmap            int // byte offset of its block map in the job table
	smem            int // dynamic shared memory (the general kernel's slots)
}

// phaseLaunch is where one phase's table parts live and what its launches
// are: rows launches rows[r0:r1] of Backend.rowsLaunches, then the dw
// reduction.
type phaseLaunch struct {
	table, bmapRed int // byte offsets into the job table
	r0, r1         int
	redBlocks      int
}

// xfer says how Execute moves a command buffer's tensors.
type xfer int

const (
	// xferAuto: buffers of at most mapMax bytes stay in their pinned host
	// memory, which the kernels read and write through its device
	// mapping (no copy, no driver call per buffer); larger ones are
	// copied, one copy each, storage reads having landed in their pinned
	// host memory already.
	xferAuto xfer = iota
	// xferCopy: every buffer copied (benchmarks: fills device memory).
	xferCopy
	// xferNone: no copies; the kernels use device memory as it is
	// (benchmarks of device-resident data).
	xferNone
)

// Stats is what the last Execute measured with device events and the host
// clock.
type Stats struct {
	Total    time.Duration // device: first upload to last download
	Kernels  time.Duration // device: the launches alone
	Host     time.Duration // host: Execute up to the synchronize (planning, table, copies, launches)
	Wall     time.Duration // host: the whole Execute
	Jobs     int           // job-table entries launched
	Launches int           // kernel launches
	Copies   int           // cuMemcpy calls (the job table's included)
	Uploads  int           // bytes copied host to device (inputs and table)
	Downs    int           // bytes copied device to host
	Mapped   int           // bytes of buffers the kernels used in pinned host memory
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

// Execute runs ops on the backend's stream: the job table (one copy), then
// for each phase one launch per rows kernel and block size over its
// entries and one of the dw reduction (stream order is the barrier between
// phases), and one synchronize. Buffers of at most mapMax bytes (a small
// job's tensors) stay in their pinned host memory, where storage reads
// landed and where the kernels read and write them through its device
// mapping: a batch of small jobs costs one copy, one or two launches and a
// synchronize, whatever its size. Larger buffers are copied, one copy each
// way (inputs no earlier op writes up, everything written down). The time
// returned is the device time from the first copy to the last.
func (b *Backend) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	return b.execute(ctx, ops, xferAuto)
}

// execute is Execute, moving tensors as mode says.
func (b *Backend) execute(ctx context.Context, ops []compute.Op, mode xfer) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t0 := time.Now()
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

	// Lay out the job table (all phases: entries, then the block map of
	// each rows launch and of the reduction) and the dw partial scratch
	// (the largest phase's; phases run one after another on the stream).
	launches, rl := b.launches[:0], b.rowsLaunches[:0]
	off, scratch, nent := 0, 0, 0
	align := func(n int) int { return (n + 15) &^ 15 }
	for _, ph := range p.phases {
		l := phaseLaunch{table: off, r0: len(rl)}
		off = align(off + len(ph)*jobEntrySize)
		ps := 0
		for i := range ph {
			e := &ph[i]
			k := e.kernel()
			j := l.r0
			for ; j < len(rl) && (rl[j].kernel != k || rl[j].threads != e.threads); j++ {
			}
			if j == len(rl) {
				rl = append(rl, rowsLaunch{kernel: k, threads: e.threads})
			}
			rl[j].blocks += e.g
			rl[j].smem = max(rl[j].smem, b.smemBytes(e))
			l.redBlocks += e.redBlocks()
			if e.dw != nil {
				ps = align(ps + 4*e.g*e.dim)
			}
		}
		l.r1 = len(rl)
		for j := l.r0; j < l.r1; j++ {
			rl[j].bmap = off
			off = align(off + 4*rl[j].blocks)
		}
		l.bmapRed = off
		off = align(off + 4*l.redBlocks)
		scratch = max(scratch, ps)
		nent += len(ph)
		launches = append(launches, l)
	}
	b.launches, b.rowsLaunches = launches, rl
	if err := b.ensure(&b.table, off, true); err != nil {
		return 0, err
	}
	if err := b.ensure(&b.scratch, scratch, false); err != nil {
		return 0, err
	}

	if off == 0 {
		return 0, nil // nothing to run (only empty phases)
	}
	st := Stats{Jobs: nent}
	mapped := func(x *buffer) bool { return mode == xferAuto && x.nbytes() <= b.mapMax && x.m.hdev != 0 }
	for _, bufs := range [2][]*buffer{p.uploads, p.downloads} {
		for _, x := range bufs {
			if mapped(x) {
				st.Mapped += x.nbytes()
			} else if err := b.devMem(x.m); err != nil {
				return 0, fmt.Errorf("cuda: buffer %v, copied: %w", x.shape, err)
			}
		}
	}
	// Fill the table in pinned host memory.
	host := unsafe.Slice((*byte)(b.table.host), b.table.size)
	dev := func(x *buffer) uint64 {
		switch {
		case x == nil:
			return 0
		case mapped(x):
			return x.m.hdev
		}
		return x.m.dptr
	}
	for pi, ph := range p.phases {
		l := launches[pi]
		if len(ph) == 0 {
			continue
		}
		tab := unsafe.Slice((*jobEntry)(unsafe.Pointer(&host[l.table])), len(ph))
		var bmd []int32
		if l.redBlocks > 0 {
			bmd = unsafe.Slice((*int32)(unsafe.Pointer(&host[l.bmapRed])), l.redBlocks)
		}
		// starts[j] counts the blocks of rows launch l.r0+j given out.
		var startsArr [16]int
		starts := startsArr[:0]
		for range l.r1 - l.r0 {
			starts = append(starts, 0)
		}
		rstart, part := 0, 0
		for i := range ph {
			e := &ph[i]
			k := e.kernel()
			j := l.r0
			for ; rl[j].kernel != k || rl[j].threads != e.threads; j++ {
			}
			bm := unsafe.Slice((*int32)(unsafe.Pointer(&host[rl[j].bmap])), rl[j].blocks)
			start := &starts[j-l.r0]
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
	if err := b.spin(b.hold); err != nil {
		return 0, err
	}
	if err := d.check("cuEventRecord", d.cuEventRecord(b.evStart, s)); err != nil {
		return 0, err
	}
	if mode != xferNone {
		for _, x := range p.uploads {
			if mapped(x) {
				continue
			}
			if err := d.check("cuMemcpyHtoDAsync", d.cuMemcpyHtoDAsync(x.m.dptr, x.m.host, uintptr(x.nbytes()), s)); err != nil {
				return 0, fmt.Errorf("cuda: uploading a %v buffer: %w", x.shape, err)
			}
			st.Uploads += x.nbytes()
			st.Copies++
		}
	}
	if err := d.check("cuMemcpyHtoDAsync", d.cuMemcpyHtoDAsync(b.table.dptr, b.table.host, uintptr(off), s)); err != nil {
		return 0, fmt.Errorf("cuda: uploading the job table (%d bytes): %w", off, err)
	}
	st.Uploads += off
	st.Copies++
	if err := d.check("cuEventRecord", d.cuEventRecord(b.evK0, s)); err != nil {
		return 0, err
	}
	for _, l := range launches {
		for _, r := range rl[l.r0:l.r1] {
			if err := b.launch(b.fnRows[r.kernel], rowsKernelName(r.kernel), r.threads, r.blocks, r.smem, l.table, r.bmap, false); err != nil {
				return 0, err
			}
			st.Launches++
		}
		if l.redBlocks > 0 && !b.noReduce {
			if err := b.launch(b.fnReduce, shaders.CUDAReduceKernel, redSlices*redChunks, l.redBlocks, 0, l.table, l.bmapRed, b.pdl); err != nil {
				return 0, err
			}
			st.Launches++
		}
	}
	if err := d.check("cuEventRecord", d.cuEventRecord(b.evK1, s)); err != nil {
		return 0, err
	}
	if mode != xferNone {
		for _, x := range p.downloads {
			if mapped(x) {
				continue
			}
			if err := d.check("cuMemcpyDtoHAsync", d.cuMemcpyDtoHAsync(x.m.host, x.m.dptr, uintptr(x.nbytes()), s)); err != nil {
				return 0, fmt.Errorf("cuda: downloading a %v buffer: %w", x.shape, err)
			}
			st.Downs += x.nbytes()
			st.Copies++
		}
	}
	if err := d.check("cuEventRecord", d.cuEventRecord(b.evEnd, s)); err != nil {
		return 0, err
	}
	st.Host = time.Since(t0)
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
	st.Wall = time.Since(t0)
	b.last = st
	return st.Total, nil
}

// rowsKernelName names rows kernel k (kRows, kFused0+class) for errors.
func rowsKernelName(k int) string {
	if k >= kFused0 {
		return fusedKernelName(k)
	}
	return shaders.CUDARowsKernel
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
	if err := b.devMem(nm); err != nil { // a pooled buffer may have none
		b.freeMem(nm)
		return err
	}
	b.freeMem(*m)
	*m = nm
	return nil
}
