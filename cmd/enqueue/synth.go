package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"golang.org/x/sync/errgroup"

	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
)

// shape is one ROWSxDIM.
type shape struct{ rows, dim int }

func parseShapes(s string) ([]shape, error) {
	var out []shape
	for _, part := range strings.Split(s, ",") {
		r, d, ok := strings.Cut(strings.TrimSpace(part), "x")
		rows, err1 := strconv.Atoi(r)
		dim, err2 := strconv.Atoi(d)
		if !ok || err1 != nil || err2 != nil || rows <= 0 || dim <= 0 {
			return nil, fmt.Errorf("--shape: %q is not ROWSxDIM with positive integers", part)
		}
		out = append(out, shape{rows, dim})
	}
	return out, nil
}

func cmdSynth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("synth", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf connFlags
	cf.register(fs)
	count := fs.Int("count", 100, "number of jobs")
	shapes := fs.String("shape", "8x1024", "ROWSxDIM, or a comma-separated list cycled through for mixed shapes")
	prefix := fs.String("prefix", "", "where inputs and outputs go: s3://bucket/prefix or file:///dir (default: upload_prefix, else file store root)")
	seed := fs.Uint64("seed", 1, "random seed; the same seed gives the same tensors")
	eps := fs.Float64("eps", 1e-6, "epsilon")
	run := fs.String("run", "", "run name used in object keys and task ids (default: time-based)")
	wait := fs.Bool("wait", false, "wait for every job and check its outputs against the CPU oracle")
	parallel := fs.Int("parallel", 8, "uploads and checks in parallel")
	if err := fs.Parse(args); err != nil {
		return &exitError{2, err}
	}
	shp, err := parseShapes(*shapes)
	if err != nil {
		return &exitError{2, err}
	}
	if *count <= 0 {
		return &exitError{2, errors.New("--count must be > 0")}
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
		return &exitError{2, errors.New("no place for inputs: set --prefix, upload_prefix or the file store root")}
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

	// Upload inputs and enqueue, in parallel.
	ids := make([]string, *count)
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(*parallel)
	for i := range *count {
		g.Go(func() error {
			sh := shp[i%len(shp)]
			x, w, dy := synthInputs(*seed, i, sh)
			in := fmt.Sprintf("%s/%s/%06d.in.safetensors", base, *run, i)
			_, err := router.Write(gctx, in, []storage.OutTensor{
				{Name: "x", DType: "F32", Shape: []int{sh.rows, sh.dim}, Data: f32bytes(x)},
				{Name: "w", DType: "F32", Shape: []int{sh.dim}, Data: f32bytes(w)},
				{Name: "dy", DType: "F32", Shape: []int{sh.rows, sh.dim}, Data: f32bytes(dy)},
			}, map[string]string{"rmsgrad.synth.seed": strconv.FormatUint(*seed, 10)})
			if err != nil {
				return fmt.Errorf("job %d: upload inputs: %w", i, err)
			}
			j := jobs.Job{V: jobs.Version, X: in + "#x", W: in + "#w", DY: in + "#dy",
				Out: fmt.Sprintf("%s/%s/%06d.out.safetensors", base, *run, i), Eps: *eps}
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
			err := verify(gctx, router, *seed, i, shp[i%len(shp)], *eps, outs[i].Result)
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

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

// verify reads job i's outputs back and compares them with the float64
// oracle at the conformance suite's tolerance.
func verify(ctx context.Context, r *storage.Router, seed uint64, i int, sh shape, eps float64, res *jobs.Result) error {
	if res == nil {
		return errors.New("no result")
	}
	x, w, dy := synthInputs(seed, i, sh)
	_, wantDX, wantDW := computetest.Oracle(x, w, dy, sh.rows, sh.dim, eps)
	for _, o := range []struct {
		name string
		want []float64
	}{{"dx", wantDX}, {"dw", wantDW}} {
		info, err := r.Head(ctx, res.Out+"#"+o.name)
		if err != nil {
			return fmt.Errorf("read %s: %w", o.name, err)
		}
		buf := make([]byte, info.Size)
		if err := r.Fetch(ctx, info, buf); err != nil {
			return fmt.Errorf("read %s: %w", o.name, err)
		}
		got := make([]float32, len(buf)/4)
		for k := range got {
			got[k] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*k:]))
		}
		if err := computetest.Compare(o.name, got, o.want, sh.rows, sh.dim); err != nil {
			return err
		}
	}
	return nil
}

func synthSummary(stdout io.Writer, asJSON bool, outs []outcome, mismatches int, elapsed time.Duration) error {
	completed, failed := 0, 0
	batchSizes := map[int]int{}
	batches := map[string]bool{}
	var lat []float64
	for _, o := range outs {
		switch o.State {
		case "completed":
			completed++
			batchSizes[o.Result.BatchJobs]++
			batches[o.Result.BatchID] = true
			lat = append(lat, o.Result.Timings.Total)
		case "wrong":
			batchSizes[o.Result.BatchJobs]++
		default:
			failed++
		}
	}
	rate := float64(len(outs)) / elapsed.Seconds()
	if asJSON {
		return report(stdout, true, outs)
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
	fmt.Fprintf(stdout, "  jobs          %d\n", len(outs))
	fmt.Fprintf(stdout, "  completed     %d (outputs checked against the float64 oracle)\n", completed)
	fmt.Fprintf(stdout, "  failed        %d\n", failed)
	fmt.Fprintf(stdout, "  wrong outputs %d\n", mismatches)
	fmt.Fprintf(stdout, "  batches       %d; jobs per batch (size:jobs)%s\n", len(batches), sb.String())
	fmt.Fprintf(stdout, "  throughput    %.1f jobs/s over %.2fs (enqueue to last result)\n", rate, elapsed.Seconds())
	fmt.Fprintf(stdout, "  job latency   p50 %.1f ms, p99 %.1f ms (worker handler time)\n", percentile(lat, 50), percentile(lat, 99))
	for _, o := range outs {
		if o.State != "completed" {
			fmt.Fprintf(stdout, "  %s %s: %s\n", o.ID, o.State, o.Error)
		}
	}
	if failed+mismatches > 0 {
		return &exitError{1, fmt.Errorf("%d failed, %d wrong of %d jobs", failed, mismatches, len(outs))}
	}
	return nil
}
