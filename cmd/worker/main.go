// Command worker is the rmsgrad queue worker: an asynq server whose handler
// fetches each job's tensors into backend buffers, batches jobs into one
// command buffer per batch, and stores the gradients. See configs/worker.yaml
// for every setting, and --dev for a one-process setup with nothing
// installed.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rmsgrad/rmsgrad/internal/cliflag"
	"github.com/rmsgrad/rmsgrad/internal/devstate"
	"github.com/rmsgrad/rmsgrad/internal/logs"
	"github.com/rmsgrad/rmsgrad/jobs"
)

func main() {
	err := run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	var logged loggedError
	if err != nil && !cliflag.Printed(err) && !errors.As(err, &logged) {
		fmt.Fprintln(os.Stderr, "worker:", err)
	}
	os.Exit(cliflag.ExitCode(err))
}

// loggedError is an error run has written to the JSON log already: once
// the logger exists, stderr carries nothing but JSON lines.
type loggedError struct{ error }

func (e loggedError) Unwrap() error { return e.error }

// setProcs applies the procs key: n > 0 sets GOMAXPROCS (over the GOMAXPROCS
// variable, which Go reads at start); 0 keeps Go's default. It returns the
// value before, for run to put back when it returns (tests run it in
// process).
//
// Fewer than the host's cores pays on a GPU host: with the compute on the
// device, what is left is network and bookkeeping in short bursts, and
// every idle P the Go scheduler has is one more thread spinning to look
// for work whenever a goroutine wakes (docs/operations.md, GPU hosts).
func setProcs(n int) int {
	if n > 0 {
		return runtime.GOMAXPROCS(n)
	}
	return runtime.GOMAXPROCS(0)
}

// gpuHostMaxProcs is the GOMAXPROCS a worker on the cuda backend runs with
// when procs is 0 and the GOMAXPROCS variable is unset, on hosts with more
// cores: measured on a 16-core H200 host (docs/operations.md, GPU hosts).
const gpuHostMaxProcs = 8

// gpuHostProcs is procs 0 on a GPU host with n CPUs usable.
func gpuHostProcs(n int) int { return max(1, min(n, gpuHostMaxProcs)) }

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	cfg, printOnly, err := loadConfigTo(args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	if printOnly {
		return printConfig(stdout, cfg)
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})).With("worker", cfg.Worker)
	slog.SetDefault(log)
	// go-redis (under asynq) writes plain-text lines of its own, one per
	// failed dial while Redis is down: into the same JSON stream instead.
	logs.SetRedis(log)
	defer func() {
		if err != nil {
			log.Error("worker stopped on an error", "err", err)
			err = loggedError{err}
		}
	}()

	defer runtime.GOMAXPROCS(setProcs(cfg.Procs))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if cfg.Dev.Enabled {
		m, err := startDev(&cfg)
		if err != nil {
			return err
		}
		defer m.Close()
		fmt.Fprintf(stdout, "dev mode: embedded redis on %s, file store root %s\n", m.Addr(), cfg.Storage.FileRoot)
		log.Info("dev mode", "redis", m.Addr(), "root", cfg.Storage.FileRoot, "state_file", devstate.Path(cfg.Storage.FileRoot))
	}
	redis, err := redisOpt(cfg)
	if err != nil {
		return err
	}
	memLimit := boundMemory(cfg.BudgetBytes, cfg.Limits.HeaderBudgetBytes+cfg.PinCacheBytes, getenv)
	be, err := openBackend(cfg.Backend, poolBytes(cfg.BudgetBytes), log)
	if err != nil {
		return err
	}
	defer be.Close()
	reservePinned(be, cfg.pinReserve(), log)
	warnBudget(cfg, log)
	if cfg.Procs == 0 && getenv("GOMAXPROCS") == "" && be.Name() == "cuda" {
		// A GPU host: fewer Ps than cores (gpuHostProcs).
		runtime.GOMAXPROCS(gpuHostProcs(runtime.GOMAXPROCS(0)))
	}
	store, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := jobs.NewMetrics(reg)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "rmsgrad_storage_shared_reads_total",
		Help: "Header reads of an object served by another job's read of it in flight (a shared w), instead of a request.",
	}, func() float64 { return float64(store.r.SharedReads()) }))
	registerPoolMetrics(reg, be)
	tbe := newTracedBackend(be, reg, log)
	// The gate holds jobs while /readyz says a dependency is down (the
	// prober below sets it).
	gate := jobs.NewGate(cfg.OutageHold)
	batcher := jobs.NewBatcher(tbe, jobs.BatchConfig{MaxJobs: cfg.Batch.MaxJobs, MaxBytes: cfg.Batch.MaxBytes, MaxWait: cfg.Batch.MaxWait}, metrics, log)
	h, err := jobs.NewHandler(jobs.HandlerConfig{
		Backend: tbe, Batcher: batcher, Store: store, Budget: jobs.NewBudget(cfg.BudgetBytes),
		Limits:     jobs.Limits{MaxElements: cfg.Limits.MaxElements, MaxBytes: cfg.Limits.MaxJobBytes},
		SigningKey: cfg.secrets.SigningKey, Worker: cfg.Worker, Metrics: metrics, Logger: log, Gate: gate,
		Pins: jobs.NewPinCache(cfg.PinCacheBytes),
	})
	if err != nil {
		return err
	}
	srv := jobs.NewServers(redis, jobs.ServersConfig{Queues: cfg.Queues, Shards: cfg.Shards, Fetchers: cfg.Fetchers, Logger: log, Server: asynq.Config{
		Concurrency:    cfg.Concurrency,
		StrictPriority: cfg.StrictPrio,
		RetryDelayFunc: jobs.RetryDelay(cfg.RetryBase, cfg.RetryMax),
		// An outage (storage down, Redis gone while a result is written,
		// a job held at the gate) does not use up a job's retries.
		IsFailure:       jobs.IsFailure,
		ShutdownTimeout: cfg.Shutdown,
		// asynq polls (it does not block on Redis): when the queues are
		// empty, its fetcher sleeps 0.5-1.5 x TaskCheckInterval (default
		// 1 s), and a job enqueued meanwhile waits it out; at 64 jobs
		// outstanding that was the soak's p50/p99 (faults.TestSoak). 100 ms
		// costs an idle worker ~10 Redis calls a second.
		TaskCheckInterval: taskCheckInterval,
		// Retries and recovered jobs move from "retry" to "pending" on
		// this tick (default 5 s), which adds to every transient failure.
		DelayedTaskCheckInterval: time.Second,
		Logger:                   logs.Asynq(log),
		LogLevel:                 asynq.WarnLevel,
	}})
	insp := asynq.NewInspector(redis)
	defer insp.Close()
	reg.MustRegister(newQueueCollector(insp, srv.Queues))
	// Readiness follows Redis, the queue layout and storage: a background
	// probe, so /readyz reports an outage while it lasts and answers at
	// once. On a Cluster every master is pinged and one that does not
	// answer is named.
	redisCheck := srv.Ping
	if co, ok := redis.(jobs.ClusterOpt); ok {
		cp := newClusterProbe(co.RedisClusterClientOpt)
		defer cp.Close()
		redisCheck = cp.check
	}
	probes := newProber(reg, log,
		depCheck{"redis", redisCheck},
		depCheck{"queue layout", func(context.Context) error { return srv.Err() }},
		depCheck{"storage", store.Ping})
	probes.gate = gate
	go probes.run(ctx)
	if store.s3 != nil && cfg.Storage.S3.StaleUploadAge > 0 {
		go uploadJanitor(ctx, store.s3, cfg.Storage.S3.StaleUploadAge, log.With("component", "janitor"))
	}
	var httpAddr string
	if cfg.HTTPAddr != "" {
		addr, err := serveHTTP(ctx, cfg.HTTPAddr, reg, probes, log)
		if err != nil {
			return err
		}
		httpAddr = addr
		log.Info("http listening", "addr", addr, "paths", "/metrics /healthz /readyz")
	}
	mux := asynq.NewServeMux()
	h.Register(mux)
	if err := srv.Start(ctx, mux); err != nil {
		return fmt.Errorf("asynq server: %w", err)
	}
	// From here /readyz answers from the probes alone (before, it said
	// "starting"), so a 200 means jobs are being served.
	probes.markServing()
	log.Info("worker started", "backend", be.Name(), "device", be.DeviceName(), "queues", cfg.Queues, "asynq_queues", srv.Queues(),
		"concurrency", cfg.Concurrency, "gomaxprocs", runtime.GOMAXPROCS(0), "batch", cfg.Batch, "budget_bytes", cfg.BudgetBytes, "go_memory_limit", memLimit)
	if cfg.Dev.Enabled {
		// Written once jobs are served, so that a CLI (or scripts/demo.sh)
		// that finds the file finds a worker ready for them.
		remove, err := announceDev(stdout, cfg, httpAddr)
		if err != nil {
			return err
		}
		defer remove()
	}

	<-ctx.Done()
	stopBy := time.Now().Add(cfg.Shutdown)
	stop() // a second signal kills the process the default way
	log.Info("signal received: no new jobs; finishing the batches in flight", "shutdown_timeout", cfg.Shutdown)
	gate.Close() // jobs held at the gate go back to the queue
	// Shutdown stops fetching and waits for active handlers (which need the
	// batcher running) up to ShutdownTimeout; jobs still running after that
	// go back to the queue. Then the batcher drains what it still holds,
	// within what is left of the same timeout (at least batcherDrainMin,
	// for a command buffer already on the device), so a stop takes at most
	// shutdown_timeout plus that: the service managers' stop timeouts in
	// configs/ sit above it.
	srv.Shutdown()
	if least := time.Now().Add(batcherDrainMin); stopBy.Before(least) {
		stopBy = least
	}
	dctx, cancel := context.WithDeadline(context.Background(), stopBy)
	defer cancel()
	if err := batcher.Close(dctx); err != nil {
		return err
	}
	log.Info("worker stopped")
	return nil
}

// batcherDrainMin is the least time the batcher gets to drain at a stop.
const batcherDrainMin = 5 * time.Second

// taskCheckInterval is how often an idle worker asks Redis for work.
const taskCheckInterval = 100 * time.Millisecond

// redisOpt turns the redis section (and its secret) into asynq's option.
func redisOpt(cfg Config) (asynq.RedisConnOpt, error) {
	return cfg.Redis.Opt(cfg.secrets.RedisPassword)
}
