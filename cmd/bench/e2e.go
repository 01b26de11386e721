package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"golang.org/x/sync/errgroup"

	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/jobs"
)

// e2eResult is one end-to-end run: jobs enqueued first, then drained by the
// handler, timed from the first job's start to the last job's end.
type e2eResult struct {
	Shape      shape
	MaxJobs    int
	Jobs       int
	JobsPerS   float64
	GBs        float64       // tensor bytes (x, w, dy in; dx, dw out) per second
	CPUPerJob  time.Duration // this process's user+sys CPU per job
	AvgBatch   float64
	ProfileOut string
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchE2E runs the real jobs.Handler and jobs.Batcher on the cpu backend
// in this process, behind a real asynq server on the real redis-server,
// reading and writing through minio-go on the real versitygw.
//
// In process rather than bin/worker: cmd/worker was not buildable when this
// was written. TODO(lead): once bin/worker runs, start it here with a
// generated config (redis.addr, storage.s3.endpoint, batch.max_jobs) so the
// bench measures what users run, and keep this path for pprof.
func benchE2E(ctx context.Context, e *env, o options, shapes []shape, q queueResult, st map[string]storageResult) ([]row, []string, error) {
	mc, err := newMinio(e, o.concurrency)
	if err != nil {
		return nil, nil, err
	}
	store := &s3Store{mc: mc, bucket: benchBucket}
	var rows []row
	notes := []string{"end to end runs jobs.Handler + jobs.Batcher + compute/cpu in the bench process with a minimal minio-go store (cmd/bench/store.go: 1 ranged GET per header, 1 per tensor, 1 PUT), not bin/worker, which was not buildable yet; the three inputs of one shape are shared by its jobs (distinct outputs)."}
	run := func(s shape, maxJobs int, profile string) (e2eResult, error) {
		return runE2E(ctx, e, store, s, maxJobs, o.concurrency, profile)
	}
	var byShape = map[string]e2eResult{}
	for _, s := range shapes {
		prof := ""
		if s.Name == "small" {
			prof = filepath.Join(o.out, "worker-small.cpu.prof")
		}
		r, err := run(s, 0, prof)
		if err != nil {
			return rows, notes, err
		}
		byShape[s.Name] = r
		fig := fmt.Sprintf("%.4g jobs/s, %.3g GB/s, %.0f us CPU/job, %.1f jobs/batch", r.JobsPerS, r.GBs, float64(r.CPUPerJob.Microseconds()), r.AvgBatch)
		sc := st[s.Name]
		switch s.Name {
		case "small":
			ceil, what := sc.JobsPerS(), "storage jobs/s"
			if q.TasksPerS > 0 && q.TasksPerS < ceil {
				ceil, what = q.TasksPerS, "queue tasks/s"
			}
			rows = append(rows, ratioRow("e2e", fmt.Sprintf("small %dx%d, default batching", s.Rows, s.Dim), fig,
				"lower ceiling: "+what, r.JobsPerS, ceil, 0.5))
		case "large":
			rows = append(rows, ratioRow("e2e", fmt.Sprintf("large %dx%d", s.Rows, s.Dim), fig,
				"storage jobs/s", r.JobsPerS, sc.JobsPerS(), 0.8))
		default:
			rows = append(rows, ratioRow("e2e", fmt.Sprintf("%s %dx%d", s.Name, s.Rows, s.Dim), fig,
				"storage jobs/s", r.JobsPerS, sc.JobsPerS(), 0))
		}
		if s.Name == "small" {
			us := float64(r.CPUPerJob.Nanoseconds()) / 1e3
			row := row{Section: "e2e", What: "small: worker CPU per job (all of it, incl. minio-go and asynq client code)",
				Figure: fmt.Sprintf("%.0f us", us), Ceiling: "target < 100 us (excl. network and compute)"}
			if us < 100 {
				row.Target = "< 100 us: met"
			} else {
				row.Target = "< 100 us: see pprof (report/worker-small.cpu.prof)"
			}
			rows = append(rows, row)
		}
	}
	small := shapes[0]
	one, err := run(small, 1, "")
	if err != nil {
		return rows, notes, err
	}
	def := byShape[small.Name]
	rows = append(rows, ratioRow("batching", "small, max_jobs=1",
		fmt.Sprintf("%.4g jobs/s, %.0f us CPU/job", one.JobsPerS, float64(one.CPUPerJob.Microseconds())), "(baseline)", 0, 0, 0))
	rows = append(rows, ratioRow("batching", fmt.Sprintf("small, default (max_jobs=32), %.1f jobs/batch", def.AvgBatch),
		fmt.Sprintf("%.4g jobs/s", def.JobsPerS), "max_jobs=1 jobs/s", def.JobsPerS, one.JobsPerS, 0))
	return rows, notes, nil
}

func runE2E(ctx context.Context, e *env, store *s3Store, s shape, maxJobs, concurrency int, profile string) (e2eResult, error) {
	res := e2eResult{Shape: s, MaxJobs: maxJobs, Jobs: s.Jobs}
	prefix := fmt.Sprintf("e2e/%s-%d-%d", s.Name, maxJobs, time.Now().UnixNano())
	x, w, dy := make([]float32, s.Rows*s.Dim), make([]float32, s.Dim), make([]float32, s.Rows*s.Dim)
	fill(x, 1)
	fill(w, 2)
	fill(dy, 3)
	for _, in := range []struct {
		name  string
		shape []int
		data  []float32
	}{{"x", []int{s.Rows, s.Dim}, x}, {"w", []int{s.Dim}, w}, {"dy", []int{s.Rows, s.Dim}, dy}} {
		if err := putTensor(ctx, store.mc, prefix+"/"+in.name+".safetensors", in.shape, in.data); err != nil {
			return res, err
		}
	}
	queue := "bench-e2e-" + s.Name + fmt.Sprint(maxJobs)
	rc := asynq.RedisClientOpt{Addr: e.redis.addr}
	client := jobs.NewClient(rc, jobs.WithQueue(queue))
	defer client.Close()
	base := "s3://" + benchBucket + "/" + prefix + "/"
	g, gctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	for range 8 {
		g.Go(func() error {
			for {
				i := int(next.Add(1)) - 1
				if i >= s.Jobs {
					return nil
				}
				j := jobs.Job{X: base + "x.safetensors", W: base + "w.safetensors", DY: base + "dy.safetensors",
					Out: fmt.Sprintf("%sout/%06d.safetensors", base, i), Eps: 1e-6}
				if _, err := client.Enqueue(gctx, j); err != nil {
					return fmt.Errorf("e2e %s: enqueue: %w", s.Name, err)
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return res, err
	}

	be := cpu.New()
	defer be.Close()
	// The worker's default log level (info) with the text dropped: the
	// per-job log line's formatting is part of the worker's cost, the
	// terminal is not.
	log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	bat := jobs.NewBatcher(be, jobs.BatchConfig{MaxJobs: maxJobs}, nil, log)
	h, err := jobs.NewHandler(jobs.HandlerConfig{Backend: be, Batcher: bat, Store: store,
		Budget: jobs.NewBudget(2 << 30), Worker: "bench", Logger: log})
	if err != nil {
		return res, err
	}
	var (
		done, failed atomic.Int64
		firstErr     atomic.Value
		once         sync.Once
		start, end   time.Time
		cpu0         time.Duration
		finished     = make(chan struct{})
	)
	mux := asynq.NewServeMux()
	mux.HandleFunc(jobs.TaskType, func(ctx context.Context, t *asynq.Task) error {
		once.Do(func() { start, cpu0 = time.Now(), cpuTime() })
		err := h.ProcessTask(ctx, t)
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
		LogLevel: asynq.WarnLevel})
	if profile != "" {
		if err := os.MkdirAll(filepath.Dir(profile), 0o755); err != nil {
			return res, err
		}
		f, err := os.Create(profile)
		if err != nil {
			return res, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return res, err
		}
		defer pprof.StopCPUProfile()
		res.ProfileOut = profile
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
	srv.Shutdown()
	if err := bat.Close(ctx); err != nil {
		return res, err
	}
	if n := failed.Load(); n > 0 {
		return res, fmt.Errorf("e2e %s: %d of %d jobs failed, first: %v", s.Name, n, s.Jobs, firstErr.Load())
	}
	el := end.Sub(start).Seconds()
	res.JobsPerS = float64(s.Jobs) / el
	res.GBs = res.JobsPerS * float64(s.TensorBytes()) / 1e9
	res.CPUPerJob = cpuUsed / time.Duration(s.Jobs)
	res.AvgBatch = avgBatch(rc, queue)
	slog.Info("e2e", "shape", s.Name, "max_jobs", maxJobs, "jobs", s.Jobs, "jobs_per_s", res.JobsPerS,
		"gbs", res.GBs, "cpu_per_job", res.CPUPerJob, "avg_batch", res.AvgBatch)
	return res, nil
}

// avgBatch reads up to 500 completed tasks' results and averages the number
// of jobs in the command buffer that computed each.
func avgBatch(rc asynq.RedisClientOpt, queue string) float64 {
	insp := asynq.NewInspector(rc)
	defer insp.Close()
	tasks, err := insp.ListCompletedTasks(queue, asynq.PageSize(500))
	if err != nil || len(tasks) == 0 {
		return 0
	}
	var sum, n int
	for _, t := range tasks {
		var r jobs.Result
		if json.Unmarshal(t.Result, &r) == nil && r.BatchJobs > 0 {
			sum += r.BatchJobs
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(sum) / float64(n)
}
