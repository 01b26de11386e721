package cuda

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// SweepResult is one row of the dim sweep (TestBenchSweep).
type SweepResult struct {
	Dim       int     `json:"dim"`
	DType     string  `json:"dtype"`
	Rows      int     `json:"rows"`
	Bytes     int64   `json:"bytes"`
	OursUS    float64 `json:"ours_us"` // kernels, median, device-resident
	CopyUS    float64 `json:"copy_us"` // cuMemcpyDtoD of Bytes/2, median
	PctCopy   float64 `json:"pct_copy"`
	Class     int     `json:"class"`
	Threads   int     `json:"threads"`
	Groups    int     `json:"groups"`
	BlocksSM  int     `json:"blocks_per_sm"`
	Correct   bool    `json:"correct"` // a 64-row job of this dim and dtype against the oracle
	Kernel    string  `json:"kernel"`
	OursMinUS float64 `json:"ours_min_us"`
	OursMaxUS float64 `json:"ours_max_us"`
}

// parseSweepDims reads "lo:hi:step" (inclusive) or a comma list.
func parseSweepDims(v string) ([]int, error) {
	if lo, rest, ok := strings.Cut(v, ":"); ok {
		hi, step, _ := strings.Cut(rest, ":")
		l, e1 := strconv.Atoi(lo)
		h, e2 := strconv.Atoi(hi)
		st, e3 := strconv.Atoi(step)
		if e1 != nil || e2 != nil || e3 != nil || l <= 0 || st <= 0 || h < l {
			return nil, fmt.Errorf("sweep dims %q: want lo:hi:step", v)
		}
		var out []int
		for d := l; d <= h; d += st {
			out = append(out, d)
		}
		return out, nil
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		d, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("sweep dims %q: want lo:hi:step or a comma list", v)
		}
		out = append(out, d)
	}
	return out, nil
}

// devBuf is a device-only buffer of this backend (no pinned host memory:
// the sweep's tensors are made and used on the device), freed by free.
func (b *Backend) devBuf(t *testing.T, dt compute.DType, shape ...int) *buffer {
	t.Helper()
	n := compute.NumElements(shape)
	b.mu.Lock()
	defer b.mu.Unlock()
	unlock, err := b.bindCtx()
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	m, err := b.getMem(max(n*dt.Size(), 1), false)
	if err != nil {
		t.Fatal(err)
	}
	return &buffer{b: b, m: m, dtype: dt, shape: shape, n: n}
}

func (b *Backend) freeDev(bufs ...*buffer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	unlock, err := b.bindCtx()
	if err != nil {
		return
	}
	defer unlock()
	for _, x := range bufs {
		b.freeMem(x.m)
		x.released = true
	}
}

// fill writes values in [lo, hi) into x on the device (rms_bench_fill).
func (b *Backend) fill(t *testing.T, x *buffer, seed uint32, lo, hi float32) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	unlock, err := b.bindCtx()
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	p, n, dt := x.m.dptr, int64(x.n), int32(typeCode(x))
	args := []unsafe.Pointer{unsafe.Pointer(&p), unsafe.Pointer(&n), unsafe.Pointer(&dt), unsafe.Pointer(&seed), unsafe.Pointer(&lo), unsafe.Pointer(&hi)}
	blocks := uint32(min(int(n)/256+1, 4*max(b.sms, 1)*8))
	if err := b.d.check("cuLaunchKernel(fill)", b.d.cuLaunchKernel(b.fnFill, blocks, 1, 1, 256, 1, 1, 0, b.stream, unsafe.Pointer(&args[0]), nil)); err != nil {
		t.Fatal(err)
	}
	if err := b.d.check("cuStreamSynchronize", b.d.cuStreamSynchronize(b.stream)); err != nil {
		t.Fatal(err)
	}
}

// TestBenchSweep times the kernels at every dim of RMSGRAD_CUDA_SWEEP_DIMS
// (default every multiple of 128 from 1024 to 8192) with 16384 rows
// (RMSGRAD_CUDA_SWEEP_ROWS), in F32 and BF16 (every tensor but r;
// RMSGRAD_CUDA_SWEEP_DTYPES), on device-resident inputs made on the device,
// against a device copy of the same bytes, and checks a 64-row job of each
// dim and dtype against the float64 oracle. JSON and a Markdown table go to
// $RMSGRAD_CUDA_SWEEP (.json, .md). Skipped unless that is set.
func TestBenchSweep(t *testing.T) {
	out := os.Getenv("RMSGRAD_CUDA_SWEEP")
	if out == "" {
		t.Skip("set RMSGRAD_CUDA_SWEEP=file.json to run the CUDA dim sweep (scripts/bench-cuda.sh)")
	}
	dims, err := parseSweepDims(envOr("RMSGRAD_CUDA_SWEEP_DIMS", "1024:8192:128"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := strconv.Atoi(envOr("RMSGRAD_CUDA_SWEEP_ROWS", "16384"))
	if err != nil || rows <= 0 {
		t.Fatalf("RMSGRAD_CUDA_SWEEP_ROWS: %v", err)
	}
	var dts []compute.DType
	for _, f := range strings.Split(envOr("RMSGRAD_CUDA_SWEEP_DTYPES", "f32,bf16"), ",") {
		dt := compute.DType(strings.ToUpper(strings.TrimSpace(f)))
		if !dt.Valid() {
			t.Fatalf("RMSGRAD_CUDA_SWEEP_DTYPES: %q", f)
		}
		dts = append(dts, dt)
	}
	b := openOrSkip(t)
	defer b.Close()
	b.hold = benchHold
	ctx := context.Background()
	const reps = 15
	var res []SweepResult
	for _, dt := range dts {
		for _, dim := range dims {
			x, dy, dx := b.devBuf(t, dt, rows, dim), b.devBuf(t, dt, rows, dim), b.devBuf(t, dt, rows, dim)
			w, dw, r := b.devBuf(t, dt, dim), b.devBuf(t, dt, dim), b.devBuf(t, compute.F32, rows)
			b.fill(t, x, uint32(dim)*3+1, -1, 1)
			b.fill(t, dy, uint32(dim)*3+2, -0.5, 0.5)
			b.fill(t, w, uint32(dim)*3+3, 0.9, 1.1)
			cb := compute.NewCommandBuffer(b)
			if err := cb.RMSInv(x, r, compute.RMSInvParams(1e-5, dim), rows, dim); err != nil {
				t.Fatal(err)
			}
			cb.Barrier()
			if err := cb.DX(x, w, dy, r, dx, compute.DXParams(dim, 1e-5), rows, dim); err != nil {
				t.Fatal(err)
			}
			if err := cb.DW(x, dy, r, dw, compute.DWParams(dim, rows), rows, dim); err != nil {
				t.Fatal(err)
			}
			ops := cb.Ops()
			var ks []float64
			for i := 0; i < reps+2; i++ {
				if _, err := b.execute(ctx, ops, xferNone); err != nil {
					t.Fatal(err)
				}
				if i >= 2 {
					ks = append(ks, float64(b.LastStats().Kernels.Nanoseconds())/1000)
				}
			}
			b.freeDev(x, dy, dx, w, dw, r)
			bytes := int64(3*dt.Size()*rows*dim + 2*dt.Size()*dim)
			cp, _ := b.ceilings(t, bytes, 16, reps)
			gm := b.geometry(rows, dim, rowsCW(typeCode(x)))
			// A 64-row job of this dim and dtype through Execute, checked.
			mix := computetest.Mix{X: dt, W: dt, DY: dt, DX: dt, DW: dt}
			j := computetest.NewJob(uint64(7*dim+len(dt)), 64, dim).WithMix(mix)
			set := recordJobs(t, b, []computetest.Job{j})
			if _, err := b.execute(ctx, set.ops, xferAuto); err != nil {
				t.Fatal(err)
			}
			cerr := j.Check(readOut(set.bufs[3:6]))
			set.release()
			if cerr != nil {
				t.Errorf("dim %d %s: %v", dim, dt, cerr)
			}
			e := entry{x: x, dy: dy, dx: dx, dw: dw, computeR: true, writeR: true, dim: dim, geom: gm}
			bps := 2
			if gm.class >= 0 {
				bps = b.blocksPerSM(gm.class, gm.threads)
			}
			sr := SweepResult{Dim: dim, DType: string(dt), Rows: rows, Bytes: bytes, OursUS: median(ks), CopyUS: cp,
				Class: gm.class, Threads: gm.threads, Groups: gm.g, BlocksSM: bps, Correct: cerr == nil,
				Kernel: rowsKernelName(e.kernel()), OursMinUS: slicesMin(ks), OursMaxUS: slicesMax(ks)}
			sr.PctCopy = 100 * sr.CopyUS / sr.OursUS
			res = append(res, sr)
			t.Logf("%5dx%-5d %-4s class %2d %3d threads %d/SM %3d groups: ours %7.1f us (%.1f-%.1f) copy %7.1f us -> %5.1f%% of copy",
				rows, dim, dt, gm.class, gm.threads, bps, gm.g, sr.OursUS, sr.OursMinUS, sr.OursMaxUS, cp, sr.PctCopy)
		}
	}
	if err := writeSweep(out, b.DeviceName(), res, dts); err != nil {
		t.Fatal(err)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func slicesMin(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = min(m, x)
	}
	return m
}

func slicesMax(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// writeSweep writes the sweep as JSON at path and as a Markdown table (a
// row per dim, a column per dtype, and the lowest share per dtype) at path
// with .md for .json.
func writeSweep(path, device string, res []SweepResult, dts []compute.DType) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	enc.SetIndent("", " ")
	if err := enc.Encode(map[string]any{"device": device, "nvrtc_opts": os.Getenv("RMSGRAD_CUDA_NVRTC_OPTS"), "results": res}); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s, %d rows: kernels (rows + dw reduce) as a share of a device copy of the same bytes\n\n| dim | class, threads, blocks/SM |", device, res[0].Rows)
	for _, dt := range dts {
		fmt.Fprintf(&sb, " %s us | %s %% of copy |", strings.ToLower(string(dt)), strings.ToLower(string(dt)))
	}
	sb.WriteString("\n|---|---|")
	for range dts {
		sb.WriteString("---|---|")
	}
	sb.WriteString("\n")
	byKey := map[string]SweepResult{}
	var dimsSeen []int
	for _, r := range res {
		k := fmt.Sprint(r.Dim, r.DType)
		if _, ok := byKey[fmt.Sprint(r.Dim, string(dts[0]))]; !ok && r.DType == string(dts[0]) {
			dimsSeen = append(dimsSeen, r.Dim)
		}
		byKey[k] = r
	}
	low := map[compute.DType]SweepResult{}
	for _, d := range dimsSeen {
		r0 := byKey[fmt.Sprint(d, string(dts[0]))]
		fmt.Fprintf(&sb, "| %d | c%d, %d, %d |", d, r0.Class, r0.Threads, r0.BlocksSM)
		for _, dt := range dts {
			r, ok := byKey[fmt.Sprint(d, string(dt))]
			if !ok {
				sb.WriteString(" - | - |")
				continue
			}
			mark := ""
			if !r.Correct {
				mark = " WRONG"
			}
			fmt.Fprintf(&sb, " %.1f | %.1f%%%s |", r.OursUS, r.PctCopy, mark)
			if l, ok := low[dt]; !ok || r.PctCopy < l.PctCopy {
				low[dt] = r
			}
		}
		sb.WriteString("\n")
	}
	sb.WriteString("\n")
	for _, dt := range dts {
		if l, ok := low[dt]; ok {
			fmt.Fprintf(&sb, "lowest %s: %.1f%% at dim %d\n", strings.ToLower(string(dt)), l.PctCopy, l.Dim)
		}
	}
	return os.WriteFile(strings.TrimSuffix(path, ".json")+".md", []byte(sb.String()), 0o644)
}
