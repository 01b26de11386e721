package cuda

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// BenchResult is one row of the benchmark JSON that scripts/cuda_peers.py
// turns into the README table.
type BenchResult struct {
	Name    string  `json:"name"`
	DType   string  `json:"dtype"` // of every tensor but r: "F32" or "BF16"
	Rows    int     `json:"rows"`
	Dim     int     `json:"dim"`
	Jobs    int     `json:"jobs"`
	Bytes   int64   `json:"bytes"`     // minimal traffic: read x, dy, w; write dx, dw (in DType)
	OursUS  float64 `json:"ours_us"`   // kernels (rows + dw reduce), median, device-resident
	CopyUS  float64 `json:"copy_us"`   // cuMemcpyDtoD of Bytes/2 (Bytes moved), median
	AddUS   float64 `json:"add_us"`    // c = a + b moving Bytes (Bytes/12 floats), median
	TotalUS float64 `json:"total_us"`  // one Execute with uploads and downloads
	Sets    int     `json:"sets"`      // input sets rotated so the L2 cannot hold them
	Correct bool    `json:"correct"`   // checked against the float64 oracle
	PerJob  float64 `json:"perjob_us"` // small jobs: kernel time per job
	Launch1 float64 `json:"one_launch_per_job_us,omitempty"`
	// Batches of many jobs, each Execute as the worker runs it (small
	// buffers mapped, the rest copied) and with every buffer copied
	// (RMSGRAD_CUDA_MAP_BYTES=0), medians: the host side up to the
	// synchronize (HostUS), the whole Execute (WallUS), the device time
	// with transfers (TotalUS), driver copies and launches per Execute.
	HostUS         float64 `json:"host_us,omitempty"`
	WallUS         float64 `json:"wall_us,omitempty"`
	Copies         int     `json:"copies,omitempty"`
	Launches       int     `json:"launches,omitempty"`
	HostCopiesUS   float64 `json:"host_copies_us,omitempty"`
	WallCopiesUS   float64 `json:"wall_copies_us,omitempty"`
	TotalCopiesUS  float64 `json:"total_copies_us,omitempty"`
	CopiesCopies   int     `json:"copies_copies,omitempty"`
	MappedEqualsCp bool    `json:"mapped_equals_copied,omitempty"`
}

// readOut decodes r, dx and dw (in their dtypes) from their host views.
func readOut(b []compute.Buffer) computetest.Output {
	return computetest.Output{R: computetest.Read(b[0]), DX: computetest.Read(b[1]), DW: computetest.Read(b[2])}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// benchHold is the blocking kernel queued before every timed region of the
// benchmarks (ours and the ceilings alike): the launches behind it are
// queued while it spins, so the events time the GPU's work and not the
// host's launch latency through purego (a few us per call).
const benchHold = 50 * time.Microsecond

// timeEvents times f (stream work) with the backend's events, in us.
func (b *Backend) timeEvents(t *testing.T, f func() error) float64 {
	t.Helper()
	d, s := b.d, b.stream
	if err := b.spin(benchHold); err != nil {
		t.Fatal(err)
	}
	if err := d.check("cuEventRecord", d.cuEventRecord(b.evStart, s)); err != nil {
		t.Fatal(err)
	}
	if err := f(); err != nil {
		t.Fatal(err)
	}
	if err := d.check("cuEventRecord", d.cuEventRecord(b.evEnd, s)); err != nil {
		t.Fatal(err)
	}
	if err := d.check("cuStreamSynchronize", d.cuStreamSynchronize(s)); err != nil {
		t.Fatal(err)
	}
	var ms float32
	if err := d.check("cuEventElapsedTime", d.cuEventElapsedTime(&ms, b.evStart, b.evEnd)); err != nil {
		t.Fatal(err)
	}
	return float64(ms) * 1000
}

// ceilings measures a device copy moving bytes (read + write) and the
// c = a + b kernel over n floats, medians of reps runs, in us.
func (b *Backend) ceilings(t *testing.T, bytes int64, n, reps int) (copyUS, addUS float64) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	unlock, err := b.bindCtx()
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	n4 := (n + 3) / 4
	half := int(bytes / 2)
	var ms []*mem
	defer func() {
		for _, m := range ms {
			b.freeMem(m)
		}
	}()
	get := func(sz int) *mem {
		m, err := b.getMem(sz, false)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
		return m
	}
	src, dst := get(half), get(half)
	a, bb, c := get(16*n4), get(16*n4), get(16*n4)
	var cp, ad []float64
	args := b.args
	for i := 0; i < reps+3; i++ {
		u := b.timeEvents(t, func() error {
			return b.d.check("cuMemcpyDtoDAsync", b.d.cuMemcpyDtoDAsync(dst.dptr, src.dptr, uintptr(half), b.stream))
		})
		v := b.timeEvents(t, func() error {
			args.a, args.b, args.c, args.n = a.dptr, bb.dptr, c.dptr, int64(n4)
			args.four = [4]unsafe.Pointer{unsafe.Pointer(&args.a), unsafe.Pointer(&args.b), unsafe.Pointer(&args.c), unsafe.Pointer(&args.n)}
			blocks := uint32(min(n4/256+1, 4*max(b.sms, 1)*8))
			return b.d.check("cuLaunchKernel(add)", b.d.cuLaunchKernel(b.fnAdd, blocks, 1, 1, 256, 1, 1, 0, b.stream, unsafe.Pointer(&args.four[0]), nil))
		})
		if i >= 3 {
			cp, ad = append(cp, u), append(ad, v)
		}
	}
	return median(cp), median(ad)
}

type benchSet struct {
	bufs []compute.Buffer
	ops  []compute.Op
}

// recordJobs allocates and fills buffers for jobs (each in its Mix's
// dtypes) and records one worker batch (every RMSInv, barrier, every DX and
// DW).
func recordJobs(t *testing.T, b *Backend, jobs []computetest.Job) benchSet {
	t.Helper()
	var s benchSet
	type jb struct{ x, w, dy, r, dx, dw compute.Buffer }
	all := make([]jb, len(jobs))
	alloc := func(dt compute.DType, src []float32, shape ...int) compute.Buffer {
		buf, err := b.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		s.bufs = append(s.bufs, buf)
		if src != nil {
			dt.Encode(buf.Bytes(), src)
		}
		return buf
	}
	for i, j := range jobs {
		m := j.Mix.Norm()
		all[i] = jb{alloc(m.X, j.X, j.Rows, j.Dim), alloc(m.W, j.W, j.Dim), alloc(m.DY, j.DY, j.Rows, j.Dim),
			alloc(compute.F32, nil, j.Rows), alloc(m.DX, nil, j.Rows, j.Dim), alloc(m.DW, nil, j.Dim)}
	}
	cb := compute.NewCommandBuffer(b)
	for i, j := range jobs {
		if err := cb.RMSInv(all[i].x, all[i].r, compute.RMSInvParams(j.Eps, j.Dim), j.Rows, j.Dim); err != nil {
			t.Fatal(err)
		}
	}
	cb.Barrier()
	for i, j := range jobs {
		a := all[i]
		if err := cb.DX(a.x, a.w, a.dy, a.r, a.dx, compute.DXParams(j.Dim, j.Eps), j.Rows, j.Dim); err != nil {
			t.Fatal(err)
		}
		if err := cb.DW(a.x, a.dy, a.r, a.dw, compute.DWParams(j.Dim, j.Rows), j.Rows, j.Dim); err != nil {
			t.Fatal(err)
		}
	}
	s.ops = slices.Clone(cb.Ops())
	return s
}

func (s benchSet) release() {
	for _, b := range s.bufs {
		b.Release()
	}
}

// benchShape is one row of the table: a shape in one dtype (every tensor
// but r).
type benchShape struct {
	rows, dim int
	dt        compute.DType
}

// parseBenchShapes reads RMSGRAD_CUDA_SHAPES: comma-separated ROWSxDIM,
// each optionally followed by :bf16 or :f16 (F32 otherwise).
func parseBenchShapes(v string) ([]benchShape, error) {
	var out []benchShape
	for _, f := range strings.Split(v, ",") {
		sh, dt, _ := strings.Cut(strings.TrimSpace(f), ":")
		r, d, _ := strings.Cut(sh, "x")
		ri, err1 := strconv.Atoi(r)
		di, err2 := strconv.Atoi(d)
		bs := benchShape{ri, di, compute.F32}
		if dt != "" {
			bs.dt = compute.DType(strings.ToUpper(dt))
		}
		if err1 != nil || err2 != nil || ri <= 0 || di <= 0 || !bs.dt.Valid() {
			return nil, fmt.Errorf("RMSGRAD_CUDA_SHAPES: %q is not ROWSxDIM[:bf16|:f16]", f)
		}
		out = append(out, bs)
	}
	return out, nil
}

// TestBenchTable measures the kernels on device-resident data against a
// device copy of the same bytes and writes JSON to $RMSGRAD_CUDA_BENCH
// (scripts/bench-cuda.sh). Skipped unless that is set. The shapes run in
// F32 and, for (16384, 4096) and (32768, 8192), in BF16 too (every tensor
// but r), each against a copy of its own bytes. RMSGRAD_CUDA_SHAPES (e.g.
// "16384x4096,16384x4096:bf16,1000x257") overrides them.
func TestBenchTable(t *testing.T) {
	out := os.Getenv("RMSGRAD_CUDA_BENCH")
	if out == "" {
		t.Skip("set RMSGRAD_CUDA_BENCH=file.json to run the CUDA benchmark table (scripts/bench-cuda.sh)")
	}
	b := openOrSkip(t)
	defer b.Close()
	b.hold = benchHold
	if os.Getenv("RMSGRAD_CUDA_BENCH_HOLD") == "0" {
		b.hold = 0 // the run-3 method, for comparison
	}
	ctx := context.Background()
	shapes := []benchShape{{16384, 4096, compute.F32}, {32768, 8192, compute.F32}, {4096, 4096, compute.F32},
		{16384, 5120, compute.F32}, {1000, 257, compute.F32}, {16384, 4096, compute.BF16}, {32768, 8192, compute.BF16}}
	if v := os.Getenv("RMSGRAD_CUDA_SHAPES"); v != "" {
		var err error
		if shapes, err = parseBenchShapes(v); err != nil {
			t.Fatal(err)
		}
	}
	reps := 30
	var results []BenchResult
	for si, sh := range shapes {
		rows, dim, dt := sh.rows, sh.dim, sh.dt
		mix := computetest.Mix{X: dt, W: dt, DY: dt, DX: dt, DW: dt}
		n := rows * dim
		bytes := int64(3*dt.Size()*n + 2*dt.Size()*dim)
		// Rotate input sets so that together they are well over the 60 MB L2.
		nsets := int(min(128, max(1, (256<<20)/bytes)))
		jobs := make([]computetest.Job, nsets)
		sets := make([]benchSet, nsets)
		for k := range sets {
			jobs[k] = computetest.NewJob(uint64(1000*si+k), rows, dim).WithMix(mix)
			sets[k] = recordJobs(t, b, jobs[k:k+1])
		}
		t0 := time.Now()
		for k := range sets { // every set's inputs into device memory
			if _, err := b.execute(ctx, sets[k].ops, xferCopy); err != nil {
				t.Fatal(err)
			}
		}
		d, err := b.execute(ctx, sets[0].ops, xferAuto) // as the worker runs it; checked
		if err != nil {
			t.Fatal(err)
		}
		total := float64(d.Microseconds())
		o := readOut(sets[0].bufs[3:6])
		correct := jobs[0].Check(o) == nil
		if !correct {
			t.Errorf("%dx%d %s: %v", rows, dim, dt, jobs[0].Check(o))
		}
		ref := computetest.Output{R: slices.Clone(o.R), DX: slices.Clone(o.DX), DW: slices.Clone(o.DW)}
		var ks []float64
		for i := 0; i < reps+3; i++ {
			k := i % nsets
			if _, err := b.execute(ctx, sets[k].ops, xferNone); err != nil {
				t.Fatal(err)
			}
			if i >= 3 {
				ks = append(ks, float64(b.LastStats().Kernels.Nanoseconds())/1000)
			}
		}
		// Bitwise determinism across the repeated runs on set 0, copied.
		if _, err := b.execute(ctx, sets[0].ops, xferCopy); err != nil {
			t.Fatal(err)
		}
		if d := computetest.BitsEqual(ref, readOut(sets[0].bufs[3:6])); d != "" {
			t.Errorf("%dx%d %s: rerun differs: %s", rows, dim, dt, d)
		}
		cp, ad := b.ceilings(t, bytes, int(bytes/12), reps)
		for _, s := range sets {
			s.release()
		}
		name := fmt.Sprintf("%dx%d", rows, dim)
		if dt != compute.F32 {
			name += " " + strings.ToLower(string(dt))
		}
		r := BenchResult{Name: name, DType: string(dt), Rows: rows, Dim: dim, Jobs: 1, Bytes: bytes,
			OursUS: median(ks), CopyUS: cp, AddUS: ad, TotalUS: total, Sets: nsets, Correct: correct}
		results = append(results, r)
		t.Logf("%-12s ours %8.1f us  copy %8.1f us (%.0f GB/s)  add %8.1f us  -> %.1f%% of copy  (sets %d, setup %v)",
			r.Name, r.OursUS, r.CopyUS, float64(bytes)/r.CopyUS/1e3, r.AddUS, 100*r.CopyUS/r.OursUS, nsets, time.Since(t0).Round(time.Millisecond))
	}

	// 256 small jobs (8x1024) in one command buffer, rotating 8 batches;
	// then 32 medium jobs (64x4096), the size of a worker's batch of them.
	results = append(results, benchBatch(t, b, 256, 8, 1024, reps, true))
	results = append(results, benchBatch(t, b, 32, 64, 4096, reps, false))

	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	enc := json.NewEncoder(f)
	enc.SetIndent("", " ")
	if err := enc.Encode(map[string]any{"device": b.DeviceName(), "nvrtc_opts": os.Getenv("RMSGRAD_CUDA_NVRTC_OPTS"), "results": results}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// benchBatch times nj jobs of rows x dim (F32) in one command buffer,
// rotating 8 batches: the kernels on device-resident data (GPU time per
// job), and Execute as the worker runs it (small buffers mapped) and with
// every buffer copied, host and device side; oneEach adds the same jobs one
// command buffer each. Outputs are checked against the oracle, and mapped
// and copied runs must give the same bits.
func benchBatch(t *testing.T, b *Backend, nj, rows, dim, reps int, oneEach bool) BenchResult {
	t.Helper()
	ctx := context.Background()
	nb := 8
	batches := make([]benchSet, nb)
	var jobs0 []computetest.Job
	for k := range batches {
		jobs := make([]computetest.Job, nj)
		for i := range jobs {
			jobs[i] = computetest.NewJob(uint64(50000+1000*dim+k*nj+i), rows, dim)
		}
		if k == 0 {
			jobs0 = jobs
		}
		batches[k] = recordJobs(t, b, jobs)
	}
	defer func() {
		for _, s := range batches {
			s.release()
		}
	}()
	outs := func() []computetest.Output {
		o := make([]computetest.Output, nj)
		for i := range o {
			c := readOut(batches[0].bufs[6*i+3 : 6*i+6])
			o[i] = computetest.Output{R: slices.Clone(c.R), DX: slices.Clone(c.DX), DW: slices.Clone(c.DW)}
		}
		return o
	}
	for k := range batches {
		if _, err := b.execute(ctx, batches[k].ops, xferCopy); err != nil {
			t.Fatal(err)
		}
	}
	copied := outs()
	correct := true
	for i, j := range jobs0 {
		if err := j.Check(copied[i]); err != nil {
			t.Errorf("batch job %d (%dx%d): %v", i, rows, dim, err)
			correct = false
			break
		}
	}
	// Execute as the worker does, then with every buffer copied.
	timed := func(mapMax int) (host, wall, total float64, st Stats) {
		saved := b.mapMax
		b.mapMax = mapMax
		defer func() { b.mapMax = saved }()
		var hs, ws, ts []float64
		for i := 0; i < reps+3; i++ {
			if _, err := b.execute(ctx, batches[i%nb].ops, xferAuto); err != nil {
				t.Fatal(err)
			}
			st = b.LastStats()
			if i >= 3 {
				hs = append(hs, float64(st.Host.Nanoseconds())/1000)
				ws = append(ws, float64(st.Wall.Nanoseconds())/1000)
				ts = append(ts, float64(st.Total.Nanoseconds())/1000)
			}
		}
		return median(hs), median(ws), median(ts), st
	}
	host, wall, total, st := timed(b.mapMax)
	if _, err := b.execute(ctx, batches[0].ops, xferAuto); err != nil {
		t.Fatal(err)
	}
	same := true
	for i, o := range outs() {
		if d := computetest.BitsEqual(copied[i], o); d != "" {
			t.Errorf("batch job %d (%dx%d): mapped and copied runs differ: %s", i, rows, dim, d)
			same = false
			break
		}
	}
	hostC, wallC, totalC, stC := timed(0)
	// Device-resident kernels.
	var ks []float64
	for i := 0; i < reps+3; i++ {
		if _, err := b.execute(ctx, batches[i%nb].ops, xferNone); err != nil {
			t.Fatal(err)
		}
		if i >= 3 {
			ks = append(ks, float64(b.LastStats().Kernels.Nanoseconds())/1000)
		}
	}
	// The same jobs one command buffer each: launch cost per job.
	var one []float64
	for rep := 0; oneEach && rep < 3; rep++ {
		sum := 0.0
		for i := 0; i < nj; i++ {
			ops := batches[0].ops
			// Job i's RMSInv, the barrier, its DX and DW.
			sub := []compute.Op{ops[i], {Kind: compute.OpBarrier}, ops[nj+1+2*i], ops[nj+2+2*i]}
			if _, err := b.execute(ctx, sub, xferNone); err != nil {
				t.Fatal(err)
			}
			sum += float64(b.LastStats().Kernels.Nanoseconds()) / 1000
		}
		one = append(one, sum/float64(nj))
	}
	bytes := int64(nj * (12*rows*dim + 8*dim))
	cp, ad := b.ceilings(t, bytes, nj*rows*dim, reps)
	r := BenchResult{Name: fmt.Sprintf("%d jobs %dx%d", nj, rows, dim), DType: "F32", Rows: rows, Dim: dim, Jobs: nj, Bytes: bytes,
		OursUS: median(ks), CopyUS: cp, AddUS: ad, TotalUS: total, Sets: nb, Correct: correct && same,
		PerJob: median(ks) / float64(nj), HostUS: host, WallUS: wall, Copies: st.Copies, Launches: st.Launches,
		HostCopiesUS: hostC, WallCopiesUS: wallC, TotalCopiesUS: totalC, CopiesCopies: stC.Copies, MappedEqualsCp: same}
	if len(one) > 0 {
		r.Launch1 = median(one)
	}
	t.Logf("%s: kernels %.1f us = %.3f us/job (one command buffer per job: %.2f us/job); Execute: host %.0f us, wall %.0f us, device %.0f us, %d copies, %d launches; every buffer copied: host %.0f us, wall %.0f us, device %.0f us, %d copies",
		r.Name, r.OursUS, r.PerJob, r.Launch1, host, wall, total, st.Copies, st.Launches, hostC, wallC, totalC, stC.Copies)
	return r
}
