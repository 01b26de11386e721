package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/cuda"
	"github.com/rmsgrad/rmsgrad/internal/procattr"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/metal"
)

// e2eResult is one end-to-end run: jobs enqueued first, then drained by the
// worker, timed from the worker's start to the last job's completion.
type e2eResult struct {
	Shape     shape
	MaxJobs   int // 0: the worker's default
	Mode      string
	Jobs      int
	JobsPerS  float64
	GBs       float64       // tensor bytes (x, w, dy in; dx, dw out) per second
	CPUPerJob time.Duration // the worker process's user+sys CPU per job
	AvgBatch  float64
	// Stages is the mean of the handler's stage timings (the results'
	// timings_ms) over the Sampled jobs read back from the queue's
	// completed tasks (bin/worker and in-process runs alike).
	Stages  jobs.Timings
	Sampled int
	// Settled is what settle found and did just before the run (after
	// its inputs were staged).
	Settled settled
	// bin/worker runs only: the servers' CPU and the machine's busy cores
	// over the same interval as CPUPerJob.
	Servers serverCPU
	// bin/worker runs only: redis-server's commands over the same
	// interval (INFO commandstats; nil when it could not be read), the
	// bench's own polls of the queue's counts (three ZCARDs each)
	// included, and how many polls it made.
	Redis map[string]cmdStat
	Polls int
	// In-process runs only: heap allocations per job and the profiles.
	AllocsPerJob float64
	BytesPerJob  float64
	SharedReads  float64 // header reads per job served by another job's read in flight (storage.Router.SharedReads)
	CPUProfile   string
	AllocProfile string
	// Cold is the first pass of a Warm shape's run: the fresh worker's
	// first Jobs jobs (the result itself is the second pass).
	Cold *e2eResult
}

func (r e2eResult) figure() string {
	return fmt.Sprintf("%.4g jobs/s, %.3g GB/s, %.0f us CPU/job, %.1f jobs/batch", r.JobsPerS, r.GBs,
		float64(r.CPUPerJob.Nanoseconds())/1e3, r.AvgBatch)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchE2E measures the product. The headline rows run bin/worker itself,
// a separate process with its default settings (only the Redis address,
// the S3 endpoint and bucket, the queue name and, for the batching row,
// batch.max_jobs are configured), fed by jobs.Client through the real
// redis-server and reading and writing through the real versitygw; its CPU
// comes from /proc. The profile row runs the same wiring in this process
// (jobs.Handler + jobs.Batcher + compute/cpu + storage.Router + storage/s3,
// as cmd/worker builds them) so that pprof can see it; its jobs/s and
// CPU/job are printed beside bin/worker's to show the two agree.
func benchE2E(ctx context.Context, e *env, o options, shapes []shape, q queueResult, st map[string]storageResult) ([]row, []string, error) {
	rs, err := newRouterStore(ctx, e)
	if err != nil {
		return nil, nil, err
	}
	worker := o.worker
	if _, err := os.Stat(worker); err != nil {
		worker = ""
	}
	var notes []string
	if worker == "" {
		notes = append(notes, fmt.Sprintf("%s is missing (run make build): every end-to-end row ran in process with the worker's wiring instead.", o.worker))
	} else {
		notes = append(notes, fmt.Sprintf("end to end rows (except \"in process\") ran %s as a separate process with its default settings; CPU/job is that process's user+sys CPU from /proc, everything included (asynq, minio-go, net/http, compute, logging).", o.worker))
	}
	notes = append(notes, "each job reads its own x and dy objects and a w shared by all jobs of its shape, and writes its own output.")
	// Each shape's inputs are staged once and read by every run of it;
	// each run writes its own outputs. Every timed run (and every storage
	// ceiling of the rounds below) starts after settle, so that both sides
	// of a ratio start with no writeback pending.
	staged := map[string]string{}
	runBin := func(bin string, s shape, maxJobs int, extraEnv ...string) (e2eResult, error) {
		base, ok := staged[s.Name]
		if !ok {
			var err error
			if base, err = stageInputs(ctx, rs, s); err != nil {
				return e2eResult{}, err
			}
			staged[s.Name] = base
		}
		set := settle()
		var r e2eResult
		var err error
		if bin != "" {
			r, err = runWorker(ctx, e, bin, base, s, maxJobs, o.concurrency, extraEnv...)
		} else {
			r, err = runInProcess(ctx, e, base, s, maxJobs, o.concurrency, "")
		}
		r.Settled = set
		return r, err
	}
	run := func(s shape, maxJobs int) (e2eResult, error) { return runBin(worker, s, maxJobs) }
	baseline := o.baseline
	if baseline != "" {
		if _, err := os.Stat(baseline); err != nil || worker == "" {
			notes = append(notes, fmt.Sprintf("-baseline-worker %s not run: %v", baseline, err))
			baseline = ""
		}
	}
	var rows []row
	small := shapes[0]
	// The small load runs o.repeat times with the default batching and as
	// often with max_jobs=1, alternating, so that a drift in the machine's
	// load (shared cores) hits both alike; rows give the medians.
	// The small storage ceiling is measured again in each round, next to
	// the runs it is compared with: on shared cores the load drifts more
	// between sections than within a round.
	mc, err := newMinio(e, o.concurrency)
	if err != nil {
		return nil, notes, err
	}
	ceiling := func(s shape) (storageResult, error) {
		settle()
		return benchStorage(ctx, e, mc, s, s.Jobs, o.concurrency)
	}
	var defs, ones, bases, variants, pinned []e2eResult
	var smallRatios, pinnedRatios []float64
	var smallCeil []storageResult
	var smallCeilPairs [][2]float64
	var smallMix []storeMixResult
	smallRounds := max(1, o.repeat)
	if o.largeOnly {
		smallRounds = 0
	}
	if smallRounds > 0 && o.warmup {
		// An untimed warm-up: the storage server and the page cache see
		// the small load once before round 1. Without it the first round
		// met a server that had served nothing yet, and was the lowest of
		// three in most GPU-host runs (docs/benchmarks.md, "make bench").
		// Its figures go to the notes, not to any row.
		c, err := ceiling(small)
		if err != nil {
			return rows, notes, fmt.Errorf("warm-up, storage ceiling: %w", err)
		}
		r, err := run(small, 0)
		if err != nil {
			return rows, notes, fmt.Errorf("warm-up, worker run: %w", err)
		}
		notes = append(notes, fmt.Sprintf("before round 1 an untimed warm-up ran the small storage ceiling (%.0f jobs/s) and one worker run of the small load (%.0f jobs/s); neither counts in any row (-warmup=false skips it).", c.JobsPerS(), r.JobsPerS))
	}
	for round := range smallRounds {
		// The same jobs with w pinned (w_sha256) beside the default run,
		// the two in turn first, both between the round's two ceiling
		// measurements: the worker reads w once and serves it from its pin cache,
		// so a job makes the requests the ceiling counts (two GETs, one
		// PUT).
		ps := small
		ps.PinW = true
		// The round's ceiling is the higher of two measurements, one
		// before the round's runs and one after them: a ceiling caught
		// in a dip (a burst of another process on the shared cores, a
		// GC in versitygw; a measurement lasts a fraction of a second)
		// would flatter every ratio of the round. A ratio may so
		// understate the worker, never overstate it.
		c0, err := ceiling(small)
		if err != nil {
			return rows, notes, err
		}
		var r, p e2eResult
		for k := range 2 {
			if (k+round)%2 == 0 {
				r, err = run(small, 0)
			} else {
				p, err = run(ps, 0)
			}
			if err != nil {
				return rows, notes, err
			}
		}
		defs, pinned = append(defs, r), append(pinned, p)
		c1, err := ceiling(small)
		if err != nil {
			return rows, notes, err
		}
		c := higherCeiling(c0, c1)
		smallCeilPairs = append(smallCeilPairs, [2]float64{c0.JobsPerS(), c1.JobsPerS()})
		smallRatios = append(smallRatios, r.JobsPerS/c.JobsPerS())
		pinnedRatios = append(pinnedRatios, p.JobsPerS/c.JobsPerS())
		smallCeil = append(smallCeil, c)
		settle()
		m, err := benchStoreMix(ctx, e, rs, staged[small.Name], small, o.concurrency)
		if err != nil {
			return rows, notes, err
		}
		smallMix = append(smallMix, m)
		if r, err = run(small, 1); err != nil {
			return rows, notes, err
		}
		ones = append(ones, r)
		if baseline != "" {
			if r, err = runBin(baseline, small, 0); err != nil {
				return rows, notes, err
			}
			bases = append(bases, r)
		}
		if o.variantEnv != "" && worker != "" {
			if r, err = runBin(worker, small, 0, o.variantEnv); err != nil {
				return rows, notes, err
			}
			variants = append(variants, r)
		}
	}
	var def, one e2eResult
	if len(defs) > 0 {
		def, one = median(defs), median(ones)
	}
	var largeSettled *settled
	for _, s := range shapes {
		if o.largeOnly && s.Name != "large" {
			continue
		}
		r := def
		var largeRatios, bf16Ratios []float64
		var bf16Run e2eResult
		var f32s, halfs, halfVars []e2eResult
		var f32Ceil, bf16Ceil []storageResult
		switch s.Name {
		case small.Name:
		case "large":
			// The target class runs o.repeat rounds, each followed by its
			// storage ceiling measured again (as for the small class): a
			// 64 MiB PUT's rate on shared cores moves 2x between minutes,
			// and the section's ceiling was measured minutes earlier. Each
			// round also runs the same jobs with every tensor in BF16
			// (inputs staged in BF16, dx and dw written in BF16), right
			// after the F32 run, so that the pair sees the same load, and
			// measures the storage ceiling at both object sizes (64 MiB
			// for F32, 32 MiB for BF16).
			//
			// Each bin/worker run times two passes of the class's jobs in
			// one worker process (shape.Warm): the fresh worker's first
			// pass pins its pool's buffers as its handlers first need them
			// (about budget_bytes of pinned memory on a GPU host), the
			// second runs on pooled buffers, as a long-running worker does.
			// The rows give the second pass; the cold rows the first.
			s.Warm = true
			var rs []e2eResult
			for range max(1, o.repeat) {
				r, err := run(s, 0)
				if err != nil {
					return rows, notes, err
				}
				hs := s
				hs.Name, hs.DType = s.Name+"-bf16", compute.BF16
				h, err := run(hs, 0)
				if err != nil {
					return rows, notes, err
				}
				if o.largeEnv != "" && worker != "" {
					v, err := runBin(worker, hs, 0, o.largeEnv)
					if err != nil {
						return rows, notes, err
					}
					halfVars = append(halfVars, v)
				}
				c, err := ceiling(s)
				if err != nil {
					return rows, notes, err
				}
				hc, err := ceiling(hs)
				if err != nil {
					return rows, notes, err
				}
				rs, halfs = append(rs, r), append(halfs, h)
				f32Ceil, bf16Ceil = append(f32Ceil, c), append(bf16Ceil, hc)
				largeRatios = append(largeRatios, r.JobsPerS/c.JobsPerS())
				bf16Ratios = append(bf16Ratios, h.JobsPerS/r.JobsPerS)
			}
			r, bf16Run, f32s = median(rs), median(halfs), rs
			largeSettled = &rs[0].Settled
		default:
			var err error
			if r, err = run(s, 0); err != nil {
				return rows, notes, err
			}
		}
		sc := st[s.Name]
		switch s.Name {
		case "small":
			// The lower ceiling is storage's here by an order of magnitude
			// (see the queue row); the ratio is the median of the rounds'
			// ratios, each against the storage ceiling measured beside it.
			what, ratio := smallCeilingWhat, medianOf(smallRatios, func(x float64) float64 { return x })
			if q.TasksPerS > 0 && q.TasksPerS < sc.JobsPerS() {
				what, ratio = "queue tasks/s", r.JobsPerS/q.TasksPerS
			}
			var per []string
			for _, x := range smallRatios {
				per = append(per, fmt.Sprintf("%.0f%%", 100*x))
			}
			rows = append(rows, ratioRow("e2e", fmt.Sprintf("small %dx%d, default batching, %s (median of %d; rounds: %s)", s.Rows, s.Dim, s.window(), len(defs), strings.Join(per, ", ")),
				r.figure(), "lower ceiling: "+what, ratio, 1, 0.5))
			if cr, ok := streamColdRow(s, defs, smallCeil); ok {
				rows = append(rows, cr)
			}
			if sr, ok := serversRow(defs, smallCeil); ok {
				rows = append(rows, sr)
			}
			if sr, ok := stagesRow("small:", defs, o.concurrency); ok {
				rows = append(rows, sr)
			}
			if mr, ok := storeMixRow(defs, smallMix, smallCeil, o.concurrency); ok {
				rows = append(rows, mr)
			}
			if rr, ok := redisRow(defs); ok {
				rows = append(rows, rr)
			}
			if len(pinned) > 0 {
				var pper []string
				for _, x := range pinnedRatios {
					pper = append(pper, fmt.Sprintf("%.0f%%", 100*x))
				}
				rows = append(rows, ratioRow("e2e", fmt.Sprintf("small %dx%d, w pinned (w_sha256: w from the pin cache), %s (median of %d; rounds: %s)", s.Rows, s.Dim, s.window(), len(pinned), strings.Join(pper, ", ")),
					median(pinned).figure(), "lower ceiling: "+smallCeilingWhat, medianOf(pinnedRatios, func(x float64) float64 { return x }), 1, 0))
				if sr, ok := serversRow(pinned, smallCeil); ok {
					sr.What = strings.Replace(sr.What, "small:", "small, w pinned:", 1)
					rows = append(rows, sr)
				}
				if sr, ok := stagesRow("small, w pinned:", pinned, o.concurrency); ok {
					rows = append(rows, sr)
				}
			}
		case "large":
			var per []string
			for _, x := range largeRatios {
				per = append(per, fmt.Sprintf("%.0f%%", 100*x))
			}
			rows = append(rows, ratioRow("e2e", fmt.Sprintf("large %dx%d (median of %d; rounds: %s)", s.Rows, s.Dim, len(largeRatios), strings.Join(per, ", ")), r.figure(),
				"storage jobs/s, measured after each round", medianOf(largeRatios, func(x float64) float64 { return x }), 1, 0.8))
			var bper []string
			for _, x := range bf16Ratios {
				bper = append(bper, fmt.Sprintf("%.2fx", x))
			}
			rows = append(rows, ratioRow("e2e", fmt.Sprintf("large %dx%d, every tensor BF16 vs F32, jobs/s (median of %d; rounds: %s)", s.Rows, s.Dim, len(bf16Ratios), strings.Join(bper, ", ")),
				bf16Run.figure(), "F32 jobs/s of the same round", medianOf(bf16Ratios, func(x float64) float64 { return x }), 1, 1.8))
			rows = append(rows, bf16CeilingRows(s, halfs, f32Ceil, bf16Ceil)...)
			rows = append(rows, coldRows(s, f32s, halfs)...)
			if len(halfVars) > 0 {
				v := median(halfVars)
				rows = append(rows, ratioRow("variant", fmt.Sprintf("large %dx%d BF16, bin/worker with %s (median of %d; jobs/s %s vs %s)", s.Rows, s.Dim, o.largeEnv, len(halfVars),
					jobsList(halfVars), jobsList(halfs)), v.figure(), "default BF16 jobs/s, same rounds", v.JobsPerS, bf16Run.JobsPerS, 0))
				if vc, dc := colds(halfVars), colds(halfs); len(vc) == len(halfVars) && len(dc) == len(halfs) {
					rows = append(rows, ratioRow("variant", fmt.Sprintf("large %dx%d BF16, bin/worker with %s, a fresh worker's first %d jobs (cold; median of %d; jobs/s %s vs %s)", s.Rows, s.Dim, o.largeEnv, s.Jobs, len(vc),
						jobsList(vc), jobsList(dc)), median(vc).figure(), "default BF16 first-pass jobs/s, same rounds", median(vc).JobsPerS, median(dc).JobsPerS, 0))
				}
			}
		default:
			what := fmt.Sprintf("%s %dx%d", s.Name, s.Rows, s.Dim)
			if w := s.window(); w != "" && r.Cold != nil {
				what += fmt.Sprintf(", %s (a fresh worker's first %d: %.4g jobs/s, %.0f%% of storage)", w, s.Jobs, r.Cold.JobsPerS, 100*r.Cold.JobsPerS/sc.JobsPerS())
			}
			rows = append(rows, ratioRow("e2e", what, r.figure(),
				"storage jobs/s", r.JobsPerS, sc.JobsPerS(), 0))
		}
	}

	var smallSettled []settled
	for _, d := range defs {
		smallSettled = append(smallSettled, d.Settled)
	}
	notes = append(notes, settleNote(smallSettled, largeSettled))
	if len(smallCeilPairs) > 0 {
		notes = append(notes, ceilingPairsNote(smallCeilPairs))
	}
	if o.largeOnly {
		return rows, notes, nil
	}

	rows = append(rows, ratioRow("batching", fmt.Sprintf("small, max_jobs=1 (median of %d)", len(ones)), one.figure(), "(baseline)", 0, 0, 0))
	rows = append(rows, ratioRow("batching", fmt.Sprintf("small, default (max_jobs=32), %.1f jobs/batch (median of %d)", def.AvgBatch, len(defs)),
		fmt.Sprintf("%.4g jobs/s, %.0f us CPU/job", def.JobsPerS, float64(def.CPUPerJob.Nanoseconds())/1e3),
		"max_jobs=1 jobs/s", def.JobsPerS, one.JobsPerS, 0))
	rows = append(rows, ratioRow("batching", "small, CPU/job: default / max_jobs=1 (lower is better)",
		fmt.Sprintf("%s vs %s", usList(defs), usList(ones)), "max_jobs=1 CPU/job",
		float64(def.CPUPerJob), float64(one.CPUPerJob), 0))

	if len(variants) > 0 {
		v := median(variants)
		rows = append(rows, ratioRow("variant", fmt.Sprintf("small, bin/worker with %s (median of %d)", o.variantEnv, len(variants)), v.figure(),
			"default jobs/s", v.JobsPerS, def.JobsPerS, 0))
		rows = append(rows, ratioRow("variant", fmt.Sprintf("small CPU/job: with %s / default (lower is better)", o.variantEnv),
			fmt.Sprintf("%s vs %s", usList(variants), usList(defs)), "default CPU/job", float64(v.CPUPerJob), float64(def.CPUPerJob), 0))
		if sr, ok := stagesRow(fmt.Sprintf("small with %s:", o.variantEnv), variants, variantSlots(o.variantEnv, o.concurrency)); ok {
			sr.Section = "variant"
			rows = append(rows, sr)
		}
	}
	if len(bases) > 0 {
		b := median(bases)
		rows = append(rows, ratioRow("before/after", fmt.Sprintf("small, baseline worker %s (median of %d)", baseline, len(bases)), b.figure(), "(baseline)", 0, 0, 0))
		rows = append(rows, ratioRow("before/after", "small jobs/s: this tree / baseline", fmt.Sprintf("%.4g vs %.4g jobs/s", def.JobsPerS, b.JobsPerS),
			"baseline jobs/s", def.JobsPerS, b.JobsPerS, 0))
		rows = append(rows, ratioRow("before/after", "small CPU/job: this tree / baseline (lower is better)",
			fmt.Sprintf("%s vs %s", usList(defs), usList(bases)), "baseline CPU/job", float64(def.CPUPerJob), float64(b.CPUPerJob), 0))
	}
	prows, pnotes, err := benchProfile(ctx, e, o, rs, staged[small.Name], small)
	return append(rows, prows...), append(notes, pnotes...), err
}

// streamColdRow is a Stream class's cold passes (a fresh worker's first
// s.Jobs jobs, timed from its start line) against the storage ceiling of
// their rounds, beside the timed window's jobs/s. defs and ceil hold one
// entry per round; runs without a cold pass give no row.
func streamColdRow(s shape, defs []e2eResult, ceil []storageResult) (row, bool) {
	if len(defs) == 0 || len(defs) != len(ceil) {
		return row{}, false
	}
	var cs []e2eResult
	var ratios []float64
	var per []string
	for i, d := range defs {
		if d.Cold == nil || ceil[i].JobsPerS() <= 0 {
			return row{}, false
		}
		cs = append(cs, *d.Cold)
		x := d.Cold.JobsPerS / ceil[i].JobsPerS()
		ratios = append(ratios, x)
		per = append(per, fmt.Sprintf("%.0f%%", 100*x))
	}
	c := median(cs)
	return ratioRow("e2e", fmt.Sprintf("%s %dx%d, default batching, a fresh worker's first %d jobs, timed from its start line (cold; median of %d; rounds: %s; jobs/s %s, then %s in the window above)",
		s.Name, s.Rows, s.Dim, s.Jobs, len(cs), strings.Join(per, ", "), jobsList(cs), jobsList(defs)),
		c.figure(), "lower ceiling: "+smallCeilingWhat, medianOf(ratios, func(x float64) float64 { return x }), 1, 0), true
}

// colds are the first passes of the runs that have one.
func colds(rs []e2eResult) []e2eResult {
	var out []e2eResult
	for _, r := range rs {
		if r.Cold != nil {
			out = append(out, *r.Cold)
		}
	}
	return out
}

// coldRows compare the first pass of each round's runs (a fresh worker's
// first jobs, pinning its buffers) with the second (pooled buffers), for
// F32 and BF16, and give BF16 vs F32 on the first passes. rs and halfs
// hold each round's F32 and BF16 runs; runs without a first pass (the
// in-process mode) give no rows.
func coldRows(s shape, rs, halfs []e2eResult) []row {
	if len(rs) == 0 || len(rs) != len(halfs) {
		return nil
	}
	var colds, coldHalfs []e2eResult
	var ratios []float64
	for i := range rs {
		if rs[i].Cold == nil || halfs[i].Cold == nil {
			return nil
		}
		colds, coldHalfs = append(colds, *rs[i].Cold), append(coldHalfs, *halfs[i].Cold)
		ratios = append(ratios, halfs[i].Cold.JobsPerS/rs[i].Cold.JobsPerS)
	}
	var per []string
	for _, x := range ratios {
		per = append(per, fmt.Sprintf("%.2fx", x))
	}
	f, h := median(colds), median(coldHalfs)
	return []row{
		ratioRow("e2e", fmt.Sprintf("large %dx%d F32, a fresh worker's first %d jobs (cold) vs the next %d (jobs/s %s vs %s)", s.Rows, s.Dim, s.Jobs, s.Jobs, jobsList(colds), jobsList(rs)),
			f.figure(), "second-pass jobs/s, same runs", f.JobsPerS, median(rs).JobsPerS, 0),
		ratioRow("e2e", fmt.Sprintf("large %dx%d BF16, a fresh worker's first %d jobs (cold) vs the next %d (jobs/s %s vs %s)", s.Rows, s.Dim, s.Jobs, s.Jobs, jobsList(coldHalfs), jobsList(halfs)),
			h.figure(), "second-pass jobs/s, same runs", h.JobsPerS, median(halfs).JobsPerS, 0),
		ratioRow("e2e", fmt.Sprintf("large %dx%d, every tensor BF16 vs F32, cold first passes (median of %d; rounds: %s)", s.Rows, s.Dim, len(ratios), strings.Join(per, ", ")),
			h.figure(), "F32 first-pass jobs/s of the same round", medianOf(ratios, func(x float64) float64 { return x }), 1, 0),
	}
}

// bf16CeilingRows are the large BF16 rows beside the BF16-vs-F32 row:
// the BF16 jobs/s against the storage ceiling at BF16 object sizes of the
// same round, and the ratio of the two ceilings (BF16 sizes / F32 sizes):
// what halving the bytes gives the storage server itself, the bound on
// what the BF16-vs-F32 ratio can reach where storage is the limit. halfs,
// f32Ceil and bf16Ceil hold one entry per round.
func bf16CeilingRows(s shape, halfs []e2eResult, f32Ceil, bf16Ceil []storageResult) []row {
	var ratios, ceilRatios []float64
	var per, cper []string
	for i, h := range halfs {
		f, b := f32Ceil[i].JobsPerS(), bf16Ceil[i].JobsPerS()
		if b > 0 {
			ratios = append(ratios, h.JobsPerS/b)
			per = append(per, fmt.Sprintf("%.0f%%", 100*h.JobsPerS/b))
		}
		if f > 0 && b > 0 {
			ceilRatios = append(ceilRatios, b/f)
			cper = append(cper, fmt.Sprintf("%.2fx", b/f))
		}
	}
	id := func(x float64) float64 { return x }
	hs := s
	hs.DType = compute.BF16
	jobs := func(c storageResult) float64 { return c.JobsPerS() }
	return []row{
		ratioRow("e2e", fmt.Sprintf("large %dx%d BF16 (median of %d; rounds: %s)", s.Rows, s.Dim, len(ratios), strings.Join(per, ", ")),
			median(halfs).figure(), fmt.Sprintf("storage jobs/s at BF16 object sizes (%s), measured after each round", humanBytes(hs.XBytes())),
			medianOf(ratios, id), 1, 0),
		ratioRow("e2e", fmt.Sprintf("storage alone: ceiling at BF16 sizes vs F32 sizes (rounds: %s)", strings.Join(cper, ", ")),
			fmt.Sprintf("%.3g vs %.3g jobs/s (medians of %d rounds; 2 GET + 1 PUT of %s vs %s)", medianOf(bf16Ceil, jobs), medianOf(f32Ceil, jobs),
				len(bf16Ceil), humanBytes(hs.XBytes()), humanBytes(s.XBytes())),
			"storage jobs/s at F32 sizes, same round", medianOf(ceilRatios, id), 1, 0),
	}
}

// serversRow splits the small rounds' CPU by process (medians over the
// rounds): the worker, versitygw and redis-server per job, and the
// machine's busy cores, beside versitygw's CPU and the busy cores per
// job-equivalent at the storage ceiling measured in the same rounds. It
// shows whether the gap to the ceiling is the machine's cores (busy near
// the core count), the server's work per job (versitygw's CPU above its
// ceiling share: the reads of w, the PUT's checksum) or neither (latency).
func serversRow(defs []e2eResult, ceil []storageResult) (row, bool) {
	for _, r := range defs {
		if !r.Servers.OK {
			return row{}, false
		}
	}
	for _, c := range ceil {
		if !c.GetCPU.OK || !c.PutCPU.OK {
			return row{}, false
		}
	}
	w := medianOf(defs, func(r e2eResult) float64 { return float64(r.CPUPerJob.Nanoseconds()) / 1e3 })
	gw := medianOf(defs, func(r e2eResult) float64 { return perOp(r.Servers.GW, r.Jobs) })
	rs := medianOf(defs, func(r e2eResult) float64 { return perOp(r.Servers.Redis, r.Jobs) })
	busy := medianOf(defs, func(r e2eResult) float64 { return r.Servers.Busy })
	busyJob := medianOf(defs, func(r e2eResult) float64 { return 1e6 * r.Servers.Busy / r.JobsPerS })
	cgw := medianOf(ceil, func(c storageResult) float64 { return c.GWPerJob() })
	cbusy := medianOf(ceil, func(c storageResult) float64 { return c.BusyPerJob() })
	cbusyCores := medianOf(ceil, func(c storageResult) float64 { return (c.GetCPU.Busy + c.PutCPU.Busy) / 2 })
	cores := defs[0].Servers.Cores
	return row{Section: "e2e", What: fmt.Sprintf("small: CPU per job by process (medians of %d rounds; /proc)", len(defs)),
		Figure: fmt.Sprintf("worker %.0f us, versitygw %.0f us, redis-server %.0f us; machine %.0f us busy/job, %.1f of %d cores busy",
			w, gw, rs, busyJob, busy, cores),
		Ceiling: fmt.Sprintf("at the storage ceiling of the same rounds (2 GET + 1 PUT): versitygw %.0f us/job, machine %.0f us busy/job, %.1f cores busy",
			cgw, cbusy, cbusyCores)}, true
}

// redisRow gives the small default runs' Redis commands a job (INFO
// commandstats over each run, the mean a job over the runs): the queue's
// round trips and redis-server's time behind them.
func redisRow(defs []e2eResult) (row, bool) {
	var runs []map[string]cmdStat
	var jobs []int
	polls := 0.0
	for _, r := range defs {
		if r.Redis == nil || r.Jobs == 0 {
			return row{}, false
		}
		runs, jobs = append(runs, r.Redis), append(jobs, r.Jobs)
		polls += float64(r.Polls) / float64(r.Jobs) / float64(len(defs))
	}
	return row{Section: "e2e", What: fmt.Sprintf("small: redis-server's commands a job, the top 8 by time (INFO commandstats over each run, the mean of %d rounds; a Lua script's commands count in evalsha and as themselves)", len(defs)),
		Figure:  redisFigure(runs, jobs, 8),
		Ceiling: fmt.Sprintf("(the bench's own polls of the queue's counts, three zcard each, included: %.3f polls a job)", polls)}, true
}

// variantSlots is the handler slots of a run with the variant env kv
// (KEY=VALUE): its RMSGRAD_CONCURRENCY when it sets one, else def.
func variantSlots(kv string, def int) int {
	if v, ok := strings.CutPrefix(kv, "RMSGRAD_CONCURRENCY="); ok {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	return def
}

// storeMixRow sets the small default runs beside storage alone through
// the worker's store (benchStoreMix) in the same rounds: the ratio is the
// median of the rounds' end-to-end jobs/s over the store mix's, and the
// figure gives the store mix's rate against the minio-go ceiling and
// versitygw's CPU per job in both (the end-to-end runs' beside it).
func storeMixRow(defs []e2eResult, mix []storeMixResult, ceil []storageResult, concurrency int) (row, bool) {
	if len(mix) == 0 || len(mix) != len(defs) || len(ceil) != len(mix) {
		return row{}, false
	}
	var ratios []float64
	var per []string
	for i, m := range mix {
		if m.JobsPerS <= 0 {
			return row{}, false
		}
		ratios = append(ratios, defs[i].JobsPerS/m.JobsPerS)
		per = append(per, fmt.Sprintf("%.0f%%", 100*ratios[i]))
	}
	id := func(x float64) float64 { return x }
	mj := medianOf(mix, func(m storeMixResult) float64 { return m.JobsPerS })
	cj := medianOf(ceil, func(c storageResult) float64 { return c.JobsPerS() })
	gw := "versitygw CPU not read"
	if mix[0].Servers.OK && defs[0].Servers.OK {
		gw = fmt.Sprintf("versitygw %.0f us/job (end to end %.0f)",
			medianOf(mix, func(m storeMixResult) float64 { return perOp(m.Servers.GW, m.Jobs) }),
			medianOf(defs, func(r e2eResult) float64 { return perOp(r.Servers.GW, r.Jobs) }))
	}
	return ratioRow("e2e", fmt.Sprintf("small, default batching, against storage alone through the worker's store: each job's 2 Head+Fetch and 1 Write, %d goroutines, no queue, no compute (medians of %d rounds; rounds: %s)", concurrency, len(mix), strings.Join(per, ", ")),
		fmt.Sprintf("store alone %.0f jobs/s, %.2fx the minio-go ceiling of the same rounds (%.0f jobs/s); %s", mj, mj/cj, cj, gw),
		"store-alone jobs/s, measured in each round", medianOf(ratios, id), 1, 0), true
}

// median returns a run whose jobs/s, GB/s, CPU/job and jobs/batch are
// each the median over rs (the mean of the middle two for an even count).
func median(rs []e2eResult) e2eResult {
	m := rs[0]
	m.JobsPerS = medianOf(rs, func(r e2eResult) float64 { return r.JobsPerS })
	m.GBs = medianOf(rs, func(r e2eResult) float64 { return r.GBs })
	m.CPUPerJob = time.Duration(medianOf(rs, func(r e2eResult) float64 { return float64(r.CPUPerJob) }))
	m.AvgBatch = medianOf(rs, func(r e2eResult) float64 { return r.AvgBatch })
	return m
}

func medianOf[T any](xs []T, f func(T) float64) float64 {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	slices.Sort(v)
	n := len(v)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

func usList(rs []e2eResult) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%.0f", float64(r.CPUPerJob.Nanoseconds())/1e3))
	}
	return strings.Join(parts, "/") + " us"
}

// benchProfile runs the small load in process on the worker's wiring with
// the CPU and allocation profiles on, and splits the CPU profile into
// network, compute and the worker's own overhead.
func benchProfile(ctx context.Context, e *env, o options, rs routerStore, base string, small shape) ([]row, []string, error) {
	var rows []row
	var notes []string
	if base == "" {
		var err error
		if base, err = stageInputs(ctx, rs, small); err != nil {
			return rows, notes, err
		}
	}
	// Three times the class's jobs over the same inputs: at 100 Hz a
	// 2000-job run held about 50 overhead samples (5 us/job each).
	ps := small
	ps.Staged, ps.Jobs = small.staged(), 3*small.Jobs
	// Profiled o.repeat times; the rows show the run with the median
	// overhead, whose profiles keep the plain names.
	type profiled struct {
		res e2eResult
		ov  profileSplit
	}
	// Each run is followed by an I/O-floor run (ioOnly: the same jobs'
	// requests and nothing else), so that load drift hits both alike and
	// each pair gives the worker's overhead above its own requests' floor.
	var runs, floors []profiled
	var above []float64
	for i := range max(1, o.repeat) {
		var pair [2]profiled
		for k, ioRun := range []bool{false, true} {
			dir := filepath.Join(o.out, fmt.Sprintf("run%d", i))
			prof, err := runInProcessWith(ctx, e, base, ps, o.profMaxJobs, o.concurrency, dir, ioRun)
			if err != nil {
				return rows, notes, err
			}
			ov, err := analyzeCPUProfile(prof.CPUProfile, prof.Jobs)
			if err != nil {
				return rows, notes, err
			}
			pair[k] = profiled{prof, ov}
		}
		runs, floors = append(runs, pair[0]), append(floors, pair[1])
		above = append(above, pair[0].ov.OverheadPerJob()-pair[1].ov.OverheadPerJob())
	}
	byOverhead := func(a, b profiled) int { return cmp.Compare(a.ov.OverheadPerJob(), b.ov.OverheadPerJob()) }
	slices.SortFunc(floors, byOverhead)
	slices.Sort(above)
	var allFloors, allAbove []string
	for i := range floors {
		allFloors = append(allFloors, fmt.Sprintf("%.0f", floors[i].ov.OverheadPerJob()))
		allAbove = append(allAbove, fmt.Sprintf("%.0f", above[i]))
	}
	iof, iosp := floors[len(floors)/2].res, floors[len(floors)/2].ov
	slices.SortFunc(runs, byOverhead)
	var all []string
	for _, r := range runs {
		all = append(all, fmt.Sprintf("%.0f", r.ov.OverheadPerJob()))
	}
	prof, ov := runs[len(runs)/2].res, runs[len(runs)/2].ov
	for _, f := range []string{prof.CPUProfile, prof.AllocProfile, iof.CPUProfile} {
		if err := os.Rename(f, filepath.Join(o.out, filepath.Base(f))); err != nil {
			return rows, notes, err
		}
	}
	for i := range max(1, o.repeat) {
		_ = os.RemoveAll(filepath.Join(o.out, fmt.Sprintf("run%d", i)))
	}
	rows = append(rows, row{Section: "e2e", What: fmt.Sprintf("%s, in process (same wiring, %s backend, pprof on; %d jobs over %d jobs' inputs; the median-overhead run)", small.Name, e.inproc, ps.Jobs, ps.staged()),
		Figure:  prof.figure() + fmt.Sprintf(", %.0f allocs/job, %.0f KiB allocated/job, %.2f shared reads/job", prof.AllocsPerJob, prof.BytesPerJob/1024, prof.SharedReads),
		Ceiling: "(bin/worker row above)"})
	// The headline: the worker's own CPU per job above the I/O floor, the
	// part of the overhead the method can attribute to rmsgrad's
	// processing. The overhead as a whole also holds asynq's work per task
	// and the scheduler's socket wake-ups, which a handler that only makes
	// the job's requests pays as well (the I/O floor below).
	rows = append(rows, row{Section: "e2e", What: fmt.Sprintf("%s: the worker's own CPU per job above the I/O floor (each overhead run minus the I/O-floor run after it; pairs: %s us)", small.Name, strings.Join(allAbove, ", ")),
		Figure: fmt.Sprintf("%.0f us (median of the pairs)", above[len(above)/2]), Ceiling: "(what the worker's processing adds to its requests' cost: decode, checks, budget, batching, hashing, metrics, logs)"})
	rows = append(rows, row{Section: "e2e", What: fmt.Sprintf("%s: overhead per job, all of it (pprof: all samples minus network and compute; runs: %s us)", small.Name, strings.Join(all, ", ")),
		Figure: fmt.Sprintf("%.0f us (of %.0f us sampled/job: %s)", ov.OverheadPerJob(), ov.TotalPerJob(), ov.Breakdown()), Ceiling: "(the I/O floor plus the row above)"})
	// The overhead's two steady parts, measured beside it: asynq's own
	// floor (a no-op handler, same payloads and concurrency) and the
	// worker's path with neither network nor asynq.
	q, err := benchQueue(ctx, e.redis.addr, o.scaled(o.queueTasks), o.concurrency, filepath.Join(o.out, "queue-noop.cpu.prof"))
	if err != nil {
		return rows, notes, err
	}
	fl := q.Floor
	rows = append(rows, row{Section: "e2e", What: "queue floor: asynq no-op handler, CPU per task outside the network (pprof, same split)",
		Figure:  fmt.Sprintf("%.0f us (asynq %.0f + Go runtime %.0f + other %.0f; network %.0f)", fl.OverheadPerJob(), fl.us(fl.Asynq), fl.us(fl.Runtime), fl.us(fl.Other+fl.Rmsgrad), fl.us(fl.Network)),
		Ceiling: "(part of the overhead row; no handler can remove it)"})
	rows = append(rows, row{Section: "e2e", What: fmt.Sprintf("I/O floor: a handler that only makes a small job's requests (3 header reads, the output's PUT, the result write) on the worker's store, same split, run after each overhead run (runs: %s us; the median run)", strings.Join(allFloors, ", ")),
		Figure: fmt.Sprintf("%.0f us (asynq %.0f + Go runtime %.0f + rmsgrad's storage code %.0f + other %.0f; network %.0f); %.0f us CPU/job in all",
			iosp.OverheadPerJob(), iosp.us(iosp.Asynq), iosp.us(iosp.Runtime), iosp.us(iosp.Rmsgrad), iosp.us(iosp.Other), iosp.us(iosp.Network), float64(iof.CPUPerJob.Nanoseconds())/1e3),
		Ceiling: "(part of the overhead row: what the job's own requests cost outside the network frames)"})
	nn, err := benchNoNetwork(ctx, o.scaled(20000), o.concurrency, filepath.Join(o.out, "worker-nonet.cpu.prof"))
	if err != nil {
		return rows, notes, err
	}
	rows = append(rows, noNetRow(nn))
	notes = append(notes, overheadMethod)
	notes = append(notes, "top overhead functions (flat, us/job): "+ov.Top(12))
	return rows, notes, nil
}

// stageInputs uploads the inputs of n jobs of shape s: a distinct x and dy
// per job (as users send them: the header cache cannot help) and one w
// shared by all (a layer's weight). It returns the URI prefix.
func stageInputs(ctx context.Context, rs routerStore, s shape) (string, error) {
	base := fmt.Sprintf("s3://%s/e2e/%s-%d/", benchBucket, s.Name, time.Now().UnixNano())
	if err := putTensorAs(ctx, rs, base+"w.safetensors", s.dtype(), []int{s.Dim}, stagedW(s)); err != nil {
		return "", err
	}
	g, gctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	for range min(16, max(1, (256<<20)/s.XBytes())) { // at most ~0.5 GiB of staging buffers
		g.Go(func() error {
			x := make([]float32, s.Rows*s.Dim)
			for {
				i := int(next.Add(1)) - 1
				if i >= s.staged() {
					return nil
				}
				for k, name := range []string{"x", "dy"} {
					fill(x, i%7+1+10*k)
					if err := putTensorAs(gctx, rs, inputURI(base, name, i), s.dtype(), []int{s.Rows, s.Dim}, x); err != nil {
						return err
					}
				}
			}
		})
	}
	return base, g.Wait()
}

// stagedW is the w that stageInputs stores for s.
func stagedW(s shape) []float32 {
	w := make([]float32, s.Dim)
	fill(w, 2)
	return w
}

// wPin is the hex SHA-256 of the staged w's tensor data: the jobs'
// w_sha256 when s.PinW.
func wPin(s shape) string {
	w := stagedW(s)
	b := make([]byte, s.dtype().Size()*len(w))
	s.dtype().Encode(b, w)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func inputURI(base, name string, i int) string {
	return fmt.Sprintf("%s%s/%06d.safetensors", base, name, i)
}

// enqueue posts n jobs on queue from 8 goroutines.
func enqueue(ctx context.Context, rc asynq.RedisClientOpt, queue, base string, s shape) error {
	return enqueueFrom(ctx, rc, queue, base, 0, s)
}

// enqueueFrom enqueues s.Jobs jobs, from to from+s.Jobs-1 (job i reads
// staged inputs i mod s.staged() and writes output i), pinning w when
// s.PinW.
func enqueueFrom(ctx context.Context, rc asynq.RedisClientOpt, queue, base string, from int, s shape) error {
	n, staged := s.Jobs, s.staged()
	var pin string
	if s.PinW {
		pin = wPin(s)
	}
	out := base + queue + "/"
	client := jobs.NewClient(rc, jobs.WithQueue(queue))
	defer client.Close()
	g, gctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	for range 8 {
		g.Go(func() error {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return nil
				}
				i += from
				j := jobs.Job{X: inputURI(base, "x", i%staged), W: base + "w.safetensors", DY: inputURI(base, "dy", i%staged),
					Out: fmt.Sprintf("%s%06d.safetensors", out, i), Eps: 1e-6, WSHA256: pin}
				if _, err := client.Enqueue(gctx, j); err != nil {
					return fmt.Errorf("e2e: enqueue on %s: %w", queue, err)
				}
			}
		})
	}
	return g.Wait()
}

// runSeq numbers the runs' queues (and so their output prefixes).
var runSeq atomic.Int64

// procCPU is a process's user+sys CPU from /proc/<pid>/stat (Linux), in
// clock ticks of 10 ms.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("worker CPU: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("worker CPU: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("worker CPU: short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("worker CPU: malformed /proc/%d/stat", pid)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// workerStartTimeout bounds how long runWorker waits for the worker's
// start line: on a GPU host its first start compiles the CUDA kernels
// (50-80 s on an H100 host, with a progress line every 15 s), which a
// minute did not cover.
const workerStartTimeout = 5 * time.Minute

// runWorker enqueues the shape's jobs, then starts bin/worker on their
// queue and times it from its "worker started" log line until the queue's
// completed count reaches the job count.
func runWorker(ctx context.Context, e *env, bin, base string, s shape, maxJobs, concurrency int, extraEnv ...string) (e2eResult, error) {
	res := e2eResult{Shape: s, MaxJobs: maxJobs, Jobs: s.Jobs, Mode: "bin/worker"}
	queue := fmt.Sprintf("bench-worker-%s-%d-%d", s.Name, maxJobs, runSeq.Add(1))
	rc := asynq.RedisClientOpt{Addr: e.redis.addr}
	posted := s
	if s.Stream {
		// streamPasses passes' jobs, all before the worker starts: the
		// first pass is the cold one, the window times the next s.Jobs
		// completions after a sync, and the rest keep the queue full
		// while the sync runs and until the window has closed.
		posted.Jobs, posted.Staged = streamPasses*s.Jobs, s.staged()
	}
	if err := enqueue(ctx, rc, queue, base, posted); err != nil {
		return res, err
	}
	cfg := fmt.Sprintf("worker: bench\nconcurrency: %d\nqueues: {%s: 1}\nhttp_addr: \"\"\nredis: {addr: %q}\n"+
		"storage: {s3: {endpoint: %q, tls: false, allow: [{bucket: %s}]}}\n", concurrency, queue, e.redis.addr, e.s3.addr, benchBucket)
	if maxJobs > 0 {
		cfg += fmt.Sprintf("batch: {max_jobs: %d}\n", maxJobs)
	}
	path := filepath.Join(e.tmp, queue+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return res, err
	}
	cmd := exec.Command(bin, "--config", path)
	cmd.Env = append(os.Environ(), "RMSGRAD_S3_ACCESS_KEY="+e.accessKey, "RMSGRAD_S3_SECRET_KEY="+e.secretKey)
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.SysProcAttr = procattr.Child()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return res, err
	}
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("e2e: start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	var tail syncTail
	started := make(chan struct{})
	go func() {
		// Read every log line (a full pipe would stall the worker), keep
		// the last ones for errors, and note the start line.
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			tail.add(line)
			if strings.Contains(line, `"msg":"worker started"`) {
				once.Do(func() { close(started) })
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(exited)
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	select {
	case <-started:
	case <-exited:
		return res, fmt.Errorf("e2e: %s exited before starting; log:\n%s", bin, tail.String())
	case <-time.After(workerStartTimeout):
		stop()
		return res, fmt.Errorf("e2e: %s did not log \"worker started\" within %s; log:\n%s", bin, workerStartTimeout, tail.String())
	}
	qc := newQueueCounter(e.redis.addr)
	defer qc.Close()
	// pass times the queue's completed count from done to done+s.Jobs
	// (the jobs are enqueued already, or by enq once the clock runs).
	// With stream set, done is instead the count read as the clock starts,
	// and the jobs are those completed from then to the poll that ends the
	// window: the window opens and closes on a busy worker, so neither the
	// poll's period nor the worker's start or drain is in it.
	pass := func(done int, enq func() error, stream, stats bool) (e2eResult, error) {
		r := res
		rs0, rsErr := qc.cmdStats(ctx) // before the clock: a round trip of its own
		if stream {
			c, _, _, err := qc.counts(ctx, queue)
			if err != nil {
				return r, fmt.Errorf("e2e %s: read the completed count: %w", s.Name, err)
			}
			done = int(c)
			if done+s.Jobs > posted.Jobs {
				return r, fmt.Errorf("e2e %s: the worker had completed %d of the %d jobs posted when the timed window opened, too few left for a window of %d", s.Name, done, posted.Jobs, s.Jobs)
			}
		}
		start := time.Now()
		srv0 := e.snapServers()
		cpu0, err := procCPU(cmd.Process.Pid)
		if err != nil {
			return r, err
		}
		if enq != nil {
			if err := enq(); err != nil {
				return r, err
			}
		}
		polls := 0
		for {
			completed, retry, archived, err := qc.counts(ctx, queue)
			polls++
			if err == nil && completed >= int64(done+s.Jobs) {
				end := time.Now()
				cpu1, err := procCPU(cmd.Process.Pid)
				if err != nil {
					return r, err
				}
				r.Servers = e.snapServers().since(srv0)
				if rs1, err := qc.cmdStats(ctx); err == nil && rsErr == nil {
					r.Redis, r.Polls = cmdStatsSince(rs0, rs1), polls
				}
				r.Jobs = int(completed) - done
				r.finish(end.Sub(start), cpu1-cpu0, rc, queue, stats)
				return r, nil
			}
			if err == nil && (retry > 0 || archived > 0) {
				return r, fmt.Errorf("e2e %s: %d jobs failed (retry %d, archived %d); worker log:\n%s", s.Name, retry+archived, retry, archived, tail.String())
			}
			select {
			case <-ctx.Done():
				return r, fmt.Errorf("e2e %s: %w; worker log:\n%s", s.Name, ctx.Err(), tail.String())
			case <-exited:
				return r, fmt.Errorf("e2e %s: the worker exited; log:\n%s", s.Name, tail.String())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	defer stop()
	if s.Stream {
		// The cold pass is timed as every run was before streamPasses:
		// from the worker's start line to its s.Jobs-th completion. Its
		// result pages are read after the timed window, not between.
		first, err := pass(0, nil, false, false)
		if err != nil {
			return first, err
		}
		// The first pass's writeback is settled before the window opens,
		// as before every timed run and ceiling; the worker goes on
		// meanwhile, on the passes posted for it.
		settle()
		second, err := pass(0, nil, true, true)
		first.AvgBatch, first.Stages, first.Sampled = second.AvgBatch, second.Stages, second.Sampled
		second.Cold = &first
		return second, err
	}
	first, err := pass(0, nil, false, true)
	if err != nil || !s.Warm {
		return first, err
	}
	// The second pass: the same worker, its pool holding the buffers the
	// first pass pinned; the first pass's writeback is settled first, as
	// before any timed run.
	set := settle()
	second, err := pass(s.Jobs, func() error {
		return enqueueFrom(ctx, rc, queue, base, s.Jobs, s)
	}, false, true)
	second.Settled, second.Cold = set, &first
	return second, err
}

// finish derives the rates from a pass's interval; with stats, it also
// reads the queue's results (a page of Redis reads per 100 tasks).
func (r *e2eResult) finish(el, cpuUsed time.Duration, rc asynq.RedisClientOpt, queue string, stats bool) {
	r.JobsPerS = float64(r.Jobs) / el.Seconds()
	r.GBs = r.JobsPerS * float64(r.Shape.TensorBytes()) / 1e9
	r.CPUPerJob = cpuUsed / time.Duration(r.Jobs)
	if stats {
		r.AvgBatch, r.Stages, r.Sampled = resultStats(rc, queue)
	}
	slog.Info("e2e", "mode", r.Mode, "shape", r.Shape.Name, "max_jobs", r.MaxJobs, "jobs", r.Jobs, "jobs_per_s", r.JobsPerS,
		"gbs", r.GBs, "cpu_per_job", r.CPUPerJob, "avg_batch", r.AvgBatch, "allocs_per_job", r.AllocsPerJob)
}

// syncTail keeps the last 40 lines of a log.
type syncTail struct {
	mu    sync.Mutex
	lines []string
}

func (t *syncTail) add(l string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) >= 40 {
		t.lines = t.lines[1:]
	}
	t.lines = append(t.lines, l)
}

func (t *syncTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

// runInProcess runs the worker's wiring in this process: the handler, the
// batcher with the worker's default batch settings (or max_jobs), the cpu
// backend, the router over storage/s3, Prometheus metrics on a registry and
// JSON logs at info (written to io.Discard: formatting a log line is the
// worker's cost, the terminal is not). With profDir it writes a CPU profile
// and an allocation profile of the run there.
func runInProcess(ctx context.Context, e *env, base string, s shape, maxJobs, concurrency int, profDir string) (e2eResult, error) {
	return runInProcessWith(ctx, e, base, s, maxJobs, concurrency, profDir, false)
}

// runInProcessWith is runInProcess; with ioOnly the tasks go to an ioOnly
// handler instead of the worker's (the profile files are named
// "ioonly-<shape>").
func runInProcessWith(ctx context.Context, e *env, base string, s shape, maxJobs, concurrency int, profDir string, ioOnlyRun bool) (e2eResult, error) {
	res := e2eResult{Shape: s, MaxJobs: maxJobs, Jobs: s.Jobs, Mode: "in process"}
	// A store of its own, as a worker process has.
	store, err := newRouterStore(ctx, e)
	if err != nil {
		return res, err
	}
	queue := fmt.Sprintf("bench-inproc-%s-%d-%d", s.Name, maxJobs, runSeq.Add(1))
	rc := asynq.RedisClientOpt{Addr: e.redis.addr}
	if err := enqueue(ctx, rc, queue, base, s); err != nil {
		return res, err
	}
	be, err := openInProc(e.inproc)
	if err != nil {
		return res, err
	}
	defer be.Close()
	log := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})).With("worker", "bench")
	metrics := jobs.NewMetrics(prometheus.NewRegistry())
	bat := jobs.NewBatcher(be, jobs.BatchConfig{MaxJobs: maxJobs}, metrics, log)
	h, err := jobs.NewHandler(jobs.HandlerConfig{Backend: be, Batcher: bat, Store: store,
		Budget: jobs.NewBudget(2 << 30), Worker: "bench", Metrics: metrics, Logger: log})
	if err != nil {
		return res, err
	}
	var ioh *ioOnly
	if ioOnlyRun {
		ioh = newIOOnly(store, s)
	}
	var (
		done, failed atomic.Int64
		firstErr     atomic.Value
		once         sync.Once
		start, end   time.Time
		cpu0         time.Duration
		ms0          runtime.MemStats
		finished     = make(chan struct{})
	)
	// Give the memory of earlier sections (staging, the large class) back
	// now, or the runtime's background scavenger returns it during this
	// run and its madvise calls are charged to the worker.
	debug.FreeOSMemory()
	if profDir != "" {
		if err := os.MkdirAll(profDir, 0o755); err != nil {
			return res, err
		}
		name := "worker-" + s.Name
		if ioOnlyRun {
			name = "ioonly-" + s.Name
		}
		res.CPUProfile = filepath.Join(profDir, name+".cpu.prof")
		res.AllocProfile = filepath.Join(profDir, name+".allocs.prof")
		runtime.GC() // the allocation profile then holds this run's allocations mostly
	}
	mux := asynq.NewServeMux()
	mux.HandleFunc(jobs.TaskType, func(ctx context.Context, t *asynq.Task) error {
		once.Do(func() {
			runtime.ReadMemStats(&ms0)
			start, cpu0 = time.Now(), cpuTime()
		})
		var err error
		if ioh != nil {
			err = ioh.ProcessTask(ctx, t)
		} else {
			err = h.ProcessTask(ctx, t)
		}
		if err != nil {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, err)
		}
		if done.Add(1) == int64(s.Jobs) {
			end = time.Now()
			close(finished)
		}
		return err
	})
	srv := asynq.NewServer(rc, asynq.Config{Concurrency: concurrency, Queues: map[string]int{queue: 1},
		RetryDelayFunc: jobs.RetryDelay(time.Second, 5*time.Minute), LogLevel: asynq.WarnLevel})
	stopProfile := func() {}
	if res.CPUProfile != "" {
		if stopProfile, err = startCPUProfile(res.CPUProfile); err != nil {
			return res, err
		}
		defer stopProfile()
	}
	if err := srv.Start(mux); err != nil {
		return res, fmt.Errorf("e2e: start asynq server: %w", err)
	}
	select {
	case <-finished:
	case <-ctx.Done():
		srv.Shutdown()
		return res, fmt.Errorf("e2e %s: %d of %d jobs done: %w", s.Name, done.Load(), s.Jobs, ctx.Err())
	}
	cpuUsed := cpuTime() - cpu0
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	stopProfile()
	srv.Shutdown()
	if err := bat.Close(ctx); err != nil {
		return res, err
	}
	if n := failed.Load(); n > 0 {
		return res, fmt.Errorf("e2e %s: %d of %d jobs failed, first: %v", s.Name, n, s.Jobs, firstErr.Load())
	}
	res.AllocsPerJob = float64(ms1.Mallocs-ms0.Mallocs) / float64(s.Jobs)
	res.SharedReads = float64(store.r.SharedReads()) / float64(s.Jobs)
	res.BytesPerJob = float64(ms1.TotalAlloc-ms0.TotalAlloc) / float64(s.Jobs)
	if res.AllocProfile != "" {
		f, err := os.Create(res.AllocProfile)
		if err != nil {
			return res, err
		}
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		f.Close()
		if err != nil {
			return res, err
		}
	}
	res.finish(end.Sub(start), cpuUsed, rc, queue, true)
	return res, nil
}

// openInProc opens the in-process runs' backend: the cpu backend, or with
// -inproc-backend cuda or metal the GPU one, as bin/worker's auto picks on
// a host with an NVIDIA GPU or on a Mac.
func openInProc(name string) (compute.Backend, error) {
	var be compute.Backend
	var err error
	switch name {
	case "cuda":
		be, err = cuda.Open()
	case "metal":
		be, err = metal.Open()
	default:
		return cpu.New(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("-inproc-backend %s: %w", name, err)
	}
	return be, nil
}

// resultStats reads the completed tasks' results (up to 20,000, 500 a
// page) and averages the number of jobs in the command buffer that
// computed each and each stage's timing.
func resultStats(rc asynq.RedisClientOpt, queue string) (avgBatch float64, stages jobs.Timings, n int) {
	insp := asynq.NewInspector(rc)
	defer insp.Close()
	var tasks []*asynq.TaskInfo
	for page := 1; page <= 40; page++ {
		ts, err := insp.ListCompletedTasks(queue, asynq.PageSize(500), asynq.Page(page))
		if err != nil {
			break
		}
		tasks = append(tasks, ts...)
		if len(ts) < 500 {
			break
		}
	}
	var sum int
	for _, t := range tasks {
		var r jobs.Result
		if json.Unmarshal(t.Result, &r) == nil && r.BatchJobs > 0 {
			sum += r.BatchJobs
			n++
			stages.Fetch += r.Timings.Fetch
			stages.Batch += r.Timings.Batch
			stages.Compute += r.Timings.Compute
			stages.Store += r.Timings.Store
			stages.Total += r.Timings.Total
		}
	}
	if n == 0 {
		return 0, jobs.Timings{}, 0
	}
	f := float64(n)
	stages.Fetch /= f
	stages.Batch /= f
	stages.Compute /= f
	stages.Store /= f
	stages.Total /= f
	return float64(sum) / f, stages, n
}

// stagesRow splits the small runs' handler time by stage (medians over the
// runs of each run's means) and sets it beside a handler slot's cycle:
// with concurrency slots kept busy, each slot takes one job every
// concurrency / (jobs/s) seconds, so what the cycle holds beyond the
// handler's total (handler start to result written) is time the slot
// spent outside the handler: asynq's dequeue of the next task and its
// acknowledgement of the last. A large share there means the queue's round
// trips, not the job's work, bound the rate.
func stagesRow(label string, defs []e2eResult, concurrency int) (row, bool) {
	for _, r := range defs {
		if r.Sampled == 0 || r.JobsPerS <= 0 {
			return row{}, false
		}
	}
	st := func(f func(jobs.Timings) float64) float64 {
		return medianOf(defs, func(r e2eResult) float64 { return f(r.Stages) })
	}
	total := st(func(t jobs.Timings) float64 { return t.Total })
	cycle := medianOf(defs, func(r e2eResult) float64 { return 1e3 * float64(concurrency) / r.JobsPerS })
	out := cycle - total
	return row{Section: "e2e", What: fmt.Sprintf("%s handler time per job by stage (ms; each run's mean over its %d jobs' results, medians of %d rounds)", label, defs[0].Sampled, len(defs)),
		Figure: fmt.Sprintf("fetch %.2f, batch_wait %.2f, compute %.2f, store %.2f; handler total %.2f",
			st(func(t jobs.Timings) float64 { return t.Fetch }), st(func(t jobs.Timings) float64 { return t.Batch }),
			st(func(t jobs.Timings) float64 { return t.Compute }), st(func(t jobs.Timings) float64 { return t.Store }), total),
		Ceiling: fmt.Sprintf("a handler slot's cycle at %d slots (slots / jobs/s): %.2f ms, of which %.2f ms (%.0f%%) outside the handler (asynq's dequeue and ack)",
			concurrency, cycle, out, 100*out/cycle)}, true
}

// jobsList is the jobs/s of each run, for a row's label.
func jobsList(rs []e2eResult) string {
	var p []string
	for _, r := range rs {
		p = append(p, fmt.Sprintf("%.4g", r.JobsPerS))
	}
	return strings.Join(p, "/")
}

// smallCeilingWhat names the small rounds' ceiling in the rows that divide
// by it.
const smallCeilingWhat = "storage jobs/s, the higher of two measurements beside each round"

// higherCeiling returns the measurement with the higher jobs/s: a small
// round's ceiling, measured before and after the round's runs.
func higherCeiling(a, b storageResult) storageResult {
	if b.JobsPerS() > a.JobsPerS() {
		return b
	}
	return a
}

// ceilingPairsNote lists each small round's two ceiling measurements
// (before and after its runs), the higher of which its ratios divide by.
func ceilingPairsNote(pairs [][2]float64) string {
	var per []string
	for i, p := range pairs {
		per = append(per, fmt.Sprintf("round %d: %.0f before, %.0f after", i+1, p[0], p[1]))
	}
	return "each small round's storage ceiling was measured before and after the round's runs, and its ratios divide by the higher (jobs/s): " + strings.Join(per, "; ") + "."
}
