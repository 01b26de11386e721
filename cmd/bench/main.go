package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

// options are the command's flags. Defaults keep make bench under about ten
// minutes on two shared cores; the -scale flag multiplies every count.
type options struct {
	out         string
	worker      string
	concurrency int
	scale       float64
	queueTasks  int
	only        string
	repeat      int
	profShape   string
	largeOnly   bool
	warmup      bool
	baseline    string
	profMaxJobs int
	inproc      string
	variantEnv  string
	largeEnv    string
	timeout     time.Duration
	// The cluster section (cluster.go).
	clusterReplicas int
	noopWorker      string
}

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	var o options
	flag.StringVar(&o.out, "out", "report", "report directory (bench.md, bench.png)")
	flag.StringVar(&o.worker, "worker", "bin/worker", "worker binary for the end-to-end runs")
	flag.IntVar(&o.concurrency, "concurrency", 64, "handler and storage concurrency (the worker's default)")
	flag.Float64Var(&o.scale, "scale", 1, "multiply every job and object count")
	flag.IntVar(&o.queueTasks, "queue-tasks", 20000, "tasks for the queue ceiling (before -scale)")
	flag.IntVar(&o.repeat, "repeat", 3, "runs of the small end-to-end load with default batching and with max_jobs=1 (alternating; rows give medians)")
	flag.StringVar(&o.baseline, "baseline-worker", "", "another worker binary (e.g. built from an older commit) to run on the small load alternately with -worker, for a before/after in the same run")
	flag.IntVar(&o.profMaxJobs, "profile-max-jobs", 0, "batch.max_jobs of the in-process profile run (0: the worker's default)")
	flag.StringVar(&o.variantEnv, "variant-env", "", "KEY=VALUE: also run bin/worker with this in its environment on the small load (alternated), e.g. GOGC=400")
	flag.StringVar(&o.largeEnv, "large-variant-env", "", "KEY=VALUE: also run bin/worker with this in its environment on the large BF16 load, after each round's BF16 run, e.g. RMSGRAD_BUDGET_BYTES=4294967296")
	flag.BoolVar(&o.warmup, "warmup", true, "with the e2e section: before the first small round, one storage ceiling and one worker run of the small load, untimed (their figures go to the notes)")
	flag.BoolVar(&o.largeOnly, "e2e-large-only", false, "with the e2e section: run only the large class's rounds (F32, BF16, their storage ceilings), not the small and medium classes nor the profile")
	flag.StringVar(&o.inproc, "inproc-backend", "cpu", "compute backend of the in-process runs (the profile, the I/O floor): cpu, cuda on a host with an NVIDIA GPU, or metal on a Mac (bin/worker picks its own: auto)")
	flag.StringVar(&o.profShape, "profile-shape", "small", "with -only profile: the shape to profile (small, medium, large)")
	flag.StringVar(&o.only, "only", "", "comma list of sections to run: queue,storage,compute,e2e (default all), gateway (only when named), or profile (only the in-process profile of the small load), or cluster (alone: Redis Cluster per-node costs and shard scaling, report/cluster.md)")
	flag.IntVar(&o.clusterReplicas, "cluster-replicas", 0, "with -only cluster: replicas per master (0: masters only)")
	flag.StringVar(&o.noopWorker, "noop-worker", "", "internal to -only cluster: run as a no-op worker process on these Redis Cluster seed nodes")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "give up after this long")
	flag.Parse()
	if o.noopWorker != "" {
		if err := runNoopWorker(o.noopWorker, o.concurrency); err != nil {
			slog.Error("noop worker", "err", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	runSection := run
	if o.only == "cluster" {
		runSection = runCluster
	}
	if err := runSection(ctx, o); err != nil {
		slog.Error("bench failed", "err", err)
		os.Exit(1)
	}
}

func (o options) scaled(n int) int { return max(1, int(float64(n)*o.scale)) }

func (o options) want(section string) bool {
	if o.only == "" {
		return true
	}
	for _, s := range splitComma(o.only) {
		if s == section {
			return true
		}
	}
	return false
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

func run(ctx context.Context, o options) error {
	rep := &report{Start: time.Now()}
	host, _ := os.Hostname()
	rep.Host = fmt.Sprintf("%s (%s/%s, %d CPUs: %s)", host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), cpuLabel())
	rep.Config = fmt.Sprintf("concurrency %d, scale %g", o.concurrency, o.scale)

	// Job counts per class: object counts for storage, jobs for compute and
	// end to end. The large class moves 64 MiB per tensor, so it runs few,
	// but several times what the worker holds at once (its 2 GiB budget
	// fits ten): the first jobs allocate their buffers and pay the kernel's
	// first-touch page faults, the later ones find them in the backend's
	// pool, as in a worker that has been running a while. With 24 jobs (up
	// to 2026-12-03), 10 of them were that warm-up.
	//
	// The small and medium classes' runs last a fraction of a second, so
	// they are timed on a busy worker (shape.Stream), its cold start kept
	// as a row of its own.
	small := shape{Name: "small", Rows: 8, Dim: 1024, Jobs: o.scaled(2000), Stream: true}
	medium := shape{Name: "medium", Rows: 64, Dim: 4096, Jobs: o.scaled(200), Stream: true}
	large := shape{Name: "large", Rows: 4096, Dim: 4096, Jobs: o.scaled(48)}
	shapes := []shape{small, medium, large}

	e, err := startEnv(ctx)
	if err != nil {
		return err
	}
	defer e.close()
	switch o.inproc {
	case "cpu", "cuda", "metal":
		e.inproc = o.inproc
	default:
		return fmt.Errorf("-inproc-backend %q: want cpu, cuda or metal", o.inproc)
	}
	slog.Info("servers up", "redis", e.redis.addr, "versitygw", e.s3.addr)

	var q queueResult
	if o.want("queue") {
		if q, err = benchQueue(ctx, e.redis.addr, o.scaled(o.queueTasks), o.concurrency, ""); err != nil {
			return err
		}
		rep.Rows = append(rep.Rows, row{Section: "queue", What: fmt.Sprintf("asynq no-op handler, %d B payload", q.PayloadBytes),
			Figure: fmt.Sprintf("%.0f tasks/s (enqueue %.0f/s)", q.TasksPerS, q.EnqueuePerS), Ceiling: "(ceiling)"})
	}

	st := map[string]storageResult{}
	if o.want("storage") || o.want("e2e") {
		mc, err := newMinio(e, o.concurrency)
		if err != nil {
			return err
		}
		for _, s := range shapes {
			r, err := benchStorage(ctx, e, mc, s, s.Jobs, o.concurrency)
			if err != nil {
				return err
			}
			st[s.Name] = r
			rep.Rows = append(rep.Rows, row{Section: "storage", What: fmt.Sprintf("minio-go %s objects (%s)", s.Name, humanBytes(s.XBytes())),
				Figure:  fmt.Sprintf("GET %.0f/s %.2f GB/s, PUT %.0f/s %.2f GB/s; %.0f jobs/s", r.GetPerS, r.GetGBs, r.PutPerS, r.PutGBs, r.JobsPerS()),
				Ceiling: "(ceiling; jobs/s = 2 GET + 1 PUT)"})
		}
	}

	if o.want("compute") {
		cs, err := benchCompute(ctx, e.tmp, []shape{
			{Name: small.Name, Rows: small.Rows, Dim: small.Dim, Jobs: o.scaled(2000)},
			{Name: medium.Name, Rows: medium.Rows, Dim: medium.Dim, Jobs: o.scaled(100)},
			{Name: large.Name, Rows: large.Rows, Dim: large.Dim, Jobs: o.scaled(3)},
		})
		if err != nil {
			return err
		}
		copies := map[string]computeResult{}
		for _, c := range cs {
			if c.Backend == "memcopy" {
				copies[c.Shape.Name] = c
				rep.Rows = append(rep.Rows, row{Section: "compute", What: fmt.Sprintf("memcopy %s %dx%d", c.Shape.Name, c.Shape.Rows, c.Shape.Dim),
					Figure: fmt.Sprintf("%.3g GB/s read+written (= %.4g jobs/s)", c.GBs, c.JobsPerS), Ceiling: "(ceiling: " + c.Device + ")"})
			}
		}
		for _, c := range cs {
			switch {
			case c.Backend == "memcopy":
			case c.Missing != "":
				what := c.Backend
				if c.Shape.Name != "" {
					what += " " + c.Shape.Name
				}
				rep.Rows = append(rep.Rows, row{Section: "compute", What: what, Figure: c.Missing})
			default:
				m := copies[c.Shape.Name]
				rep.Rows = append(rep.Rows, ratioRow("compute", fmt.Sprintf("%s %s %dx%d", c.Backend, c.Shape.Name, c.Shape.Rows, c.Shape.Dim),
					fmt.Sprintf("%.4g jobs/s, %.3g GB/s", c.JobsPerS, c.GBs), "memcopy "+c.Shape.Name+" GB/s", c.GBs, m.GBs, 0))
			}
		}
	}

	if o.want("profile") && !o.want("e2e") {
		rs, err := newRouterStore(ctx, e)
		if err != nil {
			return err
		}
		ps := small
		for _, s := range shapes {
			if s.Name == o.profShape {
				ps = s
			}
		}
		rows, notes, err := benchProfile(ctx, e, o, rs, "", ps)
		if err != nil {
			return err
		}
		rep.Rows = append(rep.Rows, rows...)
		rep.Notes = append(rep.Notes, notes...)
	}
	if o.want("e2e") {
		rows, notes, err := benchE2E(ctx, e, o, shapes, q, st)
		if err != nil {
			return err
		}
		rep.Rows = append(rep.Rows, rows...)
		rep.Notes = append(rep.Notes, notes...)
	}

	if o.only != "" && o.want("gateway") { // not in the default run: it needs bin/gateway and python3
		rows, notes, err := benchGateway(ctx, e, o)
		if err != nil {
			return err
		}
		rep.Rows = append(rep.Rows, rows...)
		rep.Notes = append(rep.Notes, notes...)
	}

	rep.Elapsed = time.Since(rep.Start)
	rep.printText(os.Stdout)
	if err := rep.write(o.out); err != nil {
		return err
	}
	slog.Info("report written", "dir", o.out, "elapsed", rep.Elapsed.Round(time.Second))
	return nil
}

func humanBytes(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
