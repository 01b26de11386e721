package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"golang.org/x/sync/errgroup"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/internal/cliflag"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
)

// shape is one job's x shape: any leading dims, then D. rows is the
// product of the leading dims.
type shape struct {
	dims      []int
	rows, dim int
}

func (s shape) String() string {
	parts := make([]string, len(s.dims))
	for i, d := range s.dims {
		parts[i] = strconv.Itoa(d)
	}
	return strings.Join(parts, "x")
}

// parseShapes parses a comma-separated list of shapes like 8x1024 or
// 2x16x4096 ([batch, seq, D]).
func parseShapes(s string) ([]shape, error) {
	var out []shape
	for _, part := range strings.Split(s, ",") {
		fields := strings.Split(strings.TrimSpace(part), "x")
		sh := shape{rows: 1}
		for _, f := range fields {
			d, err := strconv.Atoi(f)
			if err != nil || d <= 0 {
				sh.dims = nil
				break
			}
			sh.dims = append(sh.dims, d)
		}
		if len(sh.dims) < 2 {
			return nil, fmt.Errorf("--shape: %q is not ROWSxDIM (or AxBx...xDIM) with positive integers", part)
		}
		for _, d := range sh.dims[:len(sh.dims)-1] {
			sh.rows *= d
		}
		sh.dim = sh.dims[len(sh.dims)-1]
		out = append(out, sh)
	}
	return out, nil
}

func cmdSynth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("synth")
	var cf connFlags
	cf.register(fs)
	count := fs.Int("count", 100, "number of jobs")
	shapes := fs.String("shape", "8x1024", "ROWSxDIM (or AxBx...xDIM for leading dims), or a comma-separated list cycled through for mixed shapes")
	prefix := fs.String("prefix", "", "where inputs and outputs go: s3://bucket/prefix or file:///dir (default: upload_prefix, else file store root)")
	seed := fs.Uint64("seed", 1, "random seed; the same seed gives the same tensors")
	eps := fs.Float64("eps", 1e-6, "epsilon")
	run := fs.String("run", "", "run name used in object keys and task ids (default: time-based)")
	wait := fs.Bool("wait", false, "wait for every job and check its outputs against the CPU oracle")
	parallel := fs.Int("parallel", 8, "uploads and checks in parallel")
	dtypes := fs.String("dtype", "f32", "dtype of x, w and dy: f32, bf16 or f16, or one per tensor as x/w/dy (bf16/f32/bf16); a comma-separated list is cycled through the jobs for mixed dtypes")
	gradDType := fs.String("grad-dtype", "", "dtype of dx and dw (f32, bf16, f16); default: dx like x, dw like w")
	if err := cliflag.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	shp, err := parseShapes(*shapes)
	if err != nil {
		return &cliflag.UsageError{Err: err}
	}
	dts, err := parseDTypes(*dtypes)
	if err != nil {
		return &cliflag.UsageError{Err: err}
	}
	var grad compute.DType
	if *gradDType != "" {
		if grad, err = parseDType("grad-dtype", *gradDType); err != nil {
			return &cliflag.UsageError{Err: err}
		}
	}
	if *count <= 0 {
		return cliflag.Usagef("--count must be > 0")
	}
	c, err := loadConfig(&cf)
	if err != nil {
		return err
	}
	base := *prefix
	if base == "" {
		base = c.Storage.UploadPrefix
	}
	if base == "" && c.Storage.FileRoot != "" {
		base = "file://" + strings.TrimRight(absPath(c.Storage.FileRoot), "/") + "/synth"
	}
	if base == "" {
		return cliflag.Usagef("no place for inputs: set --prefix, storage.upload_prefix (RMSGRAD_UPLOAD_PREFIX, --upload-prefix) or storage.file_root (RMSGRAD_FILE_ROOT, --root), or start worker --dev in this directory")
	}
	base = strings.TrimRight(base, "/")
	if *run == "" {
		*run = strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	router, err := openStorage(ctx, c)
	if err != nil {
		return err
	}
	client, err := openClient(c)
	if err != nil {
		return err
	}
	defer client.Close()
	noteConnection(stderr, c)

	// Upload inputs and enqueue, in parallel.
	ids := make([]string, *count)
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(*parallel)
	for i := range *count {
		g.Go(func() error {
			sh, dt := shp[i%len(shp)], dts[i%len(dts)]
			x, w, dy := synthInputs(*seed, i, sh)
			in := fmt.Sprintf("%s/%s/%06d.in.safetensors", base, *run, i)
			_, err := router.Write(gctx, in, []storage.OutTensor{
				{Name: "x", DType: string(dt.x), Shape: sh.dims, Data: encode(dt.x, x)},
				{Name: "w", DType: string(dt.w), Shape: []int{sh.dim}, Data: encode(dt.w, w)},
				{Name: "dy", DType: string(dt.dy), Shape: sh.dims, Data: encode(dt.dy, dy)},
			}, map[string]string{"rmsgrad.synth.seed": strconv.FormatUint(*seed, 10)})
			if err != nil {
				return fmt.Errorf("job %d: upload inputs: %w", i, err)
			}
			j := jobs.Job{V: jobs.Version, X: in + "#x", W: in + "#w", DY: in + "#dy",
				Out: fmt.Sprintf("%s/%s/%06d.out.safetensors", base, *run, i), Eps: *eps, GradDType: string(grad)}
			id, err := client.Enqueue(gctx, j, asynq.TaskID(fmt.Sprintf("synth-%s-%06d", *run, i)))
			if err != nil {
				return fmt.Errorf("job %d: %w", i, err)
			}
			ids[i] = id
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	enqueued := time.Since(start)
	if !cf.json {
		fmt.Fprintf(stderr, "enqueued %d jobs (run %s) in %.2fs\n", *count, *run, enqueued.Seconds())
	}
	if !*wait {
		if cf.json {
			return json.NewEncoder(stdout).Encode(map[string]any{"run": *run, "queue": c.Queue, "ids": ids})
		}
		for _, id := range ids {
			fmt.Fprintln(stdout, id)
		}
		return nil
	}
	outs := waitAll(ctx, client, ids, progressTo(stderr, cf.json))
	elapsed := time.Since(start)

	// Check every completed output against the float64 oracle.
	var mu sync.Mutex
	mismatches := 0
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(*parallel)
	for i := range outs {
		if outs[i].State != "completed" {
			continue
		}
		g.Go(func() error {
			err := verify(gctx, router, *seed, i, shp[i%len(shp)], dts[i%len(dts)], grad, *eps, outs[i].Result)
			if err != nil {
				mu.Lock()
				mismatches++
				outs[i].State, outs[i].Error = "wrong", err.Error()
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()
	return synthSummary(stdout, cf.json, outs, mismatches, elapsed)
}

func absPath(p string) string {
	if strings.HasPrefix(p, "/") {
		return p
	}
	if wd, err := os.Getwd(); err == nil {
		return wd + "/" + p
	}
	return p
}

// synthInputs makes job i's tensors deterministically from the seed.
func synthInputs(seed uint64, i int, sh shape) (x, w, dy []float32) {
	n := sh.rows * sh.dim
	s := seed*1_000_003 + uint64(i)*7919
	x = computetest.Uniform(s+1, n, 1.0)
	w = computetest.Uniform(s+2, sh.dim, 0.1)
	for k := range w {
		w[k] += 1
	}
	dy = computetest.Uniform(s+3, n, 0.5)
	return x, w, dy
}

// encode returns v as little-endian elements of dt (rounded to nearest
// even for the half dtypes).
func encode(dt compute.DType, v []float32) []byte {
	b := make([]byte, dt.Size()*len(v))
	dt.Encode(b, v)
	return b
}

// round returns v rounded to dt: the values a job of that dtype holds.
func round(dt compute.DType, v []float32) []float32 {
	out := make([]float32, len(v))
	for i, f := range v {
		out[i] = dt.Round(f)
	}
	return out
}

// verify reads job i's outputs back and compares them with the float64
// oracle on the inputs as stored (rounded to their dtypes), at the
// conformance suite's tolerance for each output's dtype; dx must be in x's
// dtype and dw in w's unless grad names one dtype for both.
func verify(ctx context.Context, r *storage.Router, seed uint64, i int, sh shape, dt inputDTypes, grad compute.DType, eps float64, res *jobs.Result) error {
	if res == nil {
		return errors.New("no result")
	}
	x, w, dy := synthInputs(seed, i, sh)
	x, w, dy = round(dt.x, x), round(dt.w, w), round(dt.dy, dy)
	_, wantDX, wantDW := computetest.Oracle(x, w, dy, sh.rows, sh.dim, eps)
	dxT, dwT := dt.x, dt.w
	if grad != "" {
		dxT, dwT = grad, grad
	}
	for _, o := range []struct {
		name  string
		dt    compute.DType
		want  []float64
		scale float64
	}{{"dx", dxT, wantDX, computetest.DXScale(x, w, dy, wantDX, sh.rows, sh.dim, eps)}, {"dw", dwT, wantDW, maxAbs(wantDW)}} {
		info, err := r.Head(ctx, res.Out+"#"+o.name)
		if err != nil {
			return fmt.Errorf("read %s: %w", o.name, err)
		}
		if wantShape := []int{sh.dim}; o.name == "dx" && !slices.Equal(info.Shape, sh.dims) ||
			o.name == "dw" && !slices.Equal(info.Shape, wantShape) {
			return fmt.Errorf("%s: shape %v (x is %v)", o.name, info.Shape, sh.dims)
		}
		if info.DType != string(o.dt) || res.DTypes[o.name] != string(o.dt) {
			return fmt.Errorf("%s: dtype %s in the object, %q in the result; want %s (inputs %s, grad dtype %q)", o.name, info.DType, res.DTypes[o.name], o.dt, dt, grad)
		}
		buf := make([]byte, info.Size)
		if err := r.Fetch(ctx, info, buf); err != nil {
			return fmt.Errorf("read %s: %w", o.name, err)
		}
		got := make([]float32, len(buf)/o.dt.Size())
		o.dt.Decode(got, buf)
		if err := computetest.CompareRounded(o.name, o.dt, got, o.want, o.scale, max(sh.rows, sh.dim)); err != nil {
			return err
		}
	}
	return nil
}

func maxAbs(v []float64) float64 {
	m := 0.0
	for _, f := range v {
		m = math.Max(m, math.Abs(f))
	}
	return m
}

// synthReport is synth's --json output.
type synthReport struct {
	Jobs       int            `json:"jobs"`
	Completed  int            `json:"completed"`
	Failed     int            `json:"failed"`
	Wrong      int            `json:"wrong"`      // completed, but an output differs from the oracle
	Batches    int            `json:"batches"`    // distinct command buffers seen in results
	BatchJobs  map[string]int `json:"batch_jobs"` // batch size -> jobs computed in batches of that size
	JobsPerSec float64        `json:"jobs_per_s"` // over ElapsedS: enqueue start to last result
	ElapsedS   float64        `json:"elapsed_s"`
	P50MS      float64        `json:"p50_ms"` // worker handler time (result timings_ms.total)
	P99MS      float64        `json:"p99_ms"`
	Outcomes   []outcome      `json:"outcomes"` // per job, in job order
}

func synthSummary(stdout io.Writer, asJSON bool, outs []outcome, mismatches int, elapsed time.Duration) error {
	rep := synthReport{Jobs: len(outs), Wrong: mismatches, BatchJobs: map[string]int{}, Outcomes: outs,
		ElapsedS: elapsed.Seconds(), JobsPerSec: float64(len(outs)) / elapsed.Seconds()}
	batchSizes := map[int]int{}
	batches := map[string]bool{}
	var lat []float64
	for _, o := range outs {
		switch o.State {
		case "completed", "wrong":
			if o.State == "completed" {
				rep.Completed++
			}
			batchSizes[o.Result.BatchJobs]++
			rep.BatchJobs[strconv.Itoa(o.Result.BatchJobs)]++
			batches[o.Result.BatchID] = true
			lat = append(lat, o.Result.Timings.Total)
		default:
			rep.Failed++
		}
	}
	rep.Batches = len(batches)
	rep.P50MS, rep.P99MS = percentile(lat, 50), percentile(lat, 99)
	var err error
	if rep.Failed+mismatches > 0 {
		err = &exitError{1, fmt.Errorf("%d failed, %d wrong of %d jobs", rep.Failed, mismatches, len(outs))}
	}
	if asJSON {
		if e := json.NewEncoder(stdout).Encode(rep); e != nil {
			return e
		}
		return err
	}
	sizes := make([]int, 0, len(batchSizes))
	for s := range batchSizes {
		sizes = append(sizes, s)
	}
	sort.Ints(sizes)
	var sb strings.Builder
	for _, s := range sizes {
		fmt.Fprintf(&sb, " %d:%d", s, batchSizes[s])
	}
	fmt.Fprintf(stdout, "synth summary\n")
	fmt.Fprintf(stdout, "  jobs          %d\n", rep.Jobs)
	fmt.Fprintf(stdout, "  completed     %d (outputs checked against the float64 oracle)\n", rep.Completed)
	fmt.Fprintf(stdout, "  failed        %d\n", rep.Failed)
	fmt.Fprintf(stdout, "  wrong outputs %d\n", mismatches)
	fmt.Fprintf(stdout, "  batches       %d; jobs per batch size (size:jobs)%s\n", rep.Batches, sb.String())
	fmt.Fprintf(stdout, "  throughput    %.1f jobs/s over %.2fs (enqueue start to last result)\n", rep.JobsPerSec, rep.ElapsedS)
	fmt.Fprintf(stdout, "  job latency   p50 %.1f ms, p99 %.1f ms (worker handler time)\n", rep.P50MS, rep.P99MS)
	for _, o := range outs {
		if o.State != "completed" {
			fmt.Fprintf(stdout, "  %s %s: %s\n", o.ID, o.State, o.Error)
		}
	}
	return err
}
