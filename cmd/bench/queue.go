package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"golang.org/x/sync/errgroup"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// queueResult is the asynq ceiling: a no-op handler draining a queue that
// was filled beforehand, with the worker's concurrency and real payloads.
type queueResult struct {
	Tasks        int
	PayloadBytes int
	Concurrency  int
	EnqueuePerS  float64 // tasks/s of the fill, for reference
	TasksPerS    float64 // first handler start to last handler end
	// Floor is the profiled drain's split (benchQueue with a profile
	// path): asynq's and the Go runtime's CPU per task outside the network,
	// the part of the per-job overhead no handler can remove.
	Floor *profileSplit
}

// samplePayload is a real job payload of the shape cmd/enqueue writes, so
// the ceiling moves the same bytes through Redis as a job does.
func samplePayload(i int) ([]byte, error) {
	p := fmt.Sprintf("s3://%s/small/%06d/", benchBucket, i)
	j := jobs.Job{V: jobs.Version, X: p + "x.safetensors", W: p + "w.safetensors", DY: p + "dy.safetensors",
		Out: p + "out.safetensors", Eps: 1e-6, EnqueuedNS: time.Now().UnixNano()}
	if err := j.Validate(); err != nil {
		return nil, fmt.Errorf("sample payload: %w", err)
	}
	return j.Payload()
}

// enqueueOptions are the options jobs.Client.Enqueue uses, so the ceiling
// pays for the same retention bookkeeping as a real job.
func enqueueOptions(queue string) []asynq.Option {
	return []asynq.Option{asynq.Queue(queue), asynq.Retention(jobs.DefaultRetention),
		asynq.MaxRetry(3), asynq.Timeout(10 * time.Minute)}
}

// benchQueue fills a queue with tasks and drains it with a no-op handler.
// With profPath it profiles the drain (CPU, runtime/pprof) into it and
// splits the profile into res.Floor.
func benchQueue(ctx context.Context, redisAddr string, tasks, concurrency int, profPath string) (queueResult, error) {
	res := queueResult{Tasks: tasks, Concurrency: concurrency}
	const queue = "bench-noop"
	rc := asynq.RedisClientOpt{Addr: redisAddr}
	client := asynq.NewClient(rc)
	defer client.Close()

	first, err := samplePayload(0)
	if err != nil {
		return res, err
	}
	res.PayloadBytes = len(first)
	opts := enqueueOptions(queue)
	t0 := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	for w := 0; w < 8; w++ {
		g.Go(func() error {
			for {
				i := int(next.Add(1)) - 1
				if i >= tasks {
					return nil
				}
				p, err := samplePayload(i)
				if err != nil {
					return err
				}
				if _, err := client.EnqueueContext(gctx, asynq.NewTask(jobs.TaskType, p), opts...); err != nil {
					return fmt.Errorf("queue ceiling: enqueue: %w", err)
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return res, err
	}
	res.EnqueuePerS = float64(tasks) / time.Since(t0).Seconds()

	var (
		done      atomic.Int64
		startOnce sync.Once
		start     time.Time
		end       time.Time
		finished  = make(chan struct{})
	)
	srv := asynq.NewServer(rc, asynq.Config{
		Concurrency: concurrency,
		Queues:      map[string]int{queue: 1},
		LogLevel:    asynq.WarnLevel,
	})
	mux := asynq.NewServeMux()
	mux.HandleFunc(jobs.TaskType, func(context.Context, *asynq.Task) error {
		startOnce.Do(func() { start = time.Now() })
		if done.Add(1) == int64(tasks) {
			end = time.Now()
			close(finished)
		}
		return nil
	})
	stopProfile := func() {}
	if profPath != "" {
		var err error
		if stopProfile, err = startCPUProfile(profPath); err != nil {
			return res, err
		}
		defer stopProfile()
	}
	if err := srv.Start(mux); err != nil {
		return res, fmt.Errorf("queue ceiling: start asynq server: %w", err)
	}
	defer srv.Shutdown()
	select {
	case <-finished:
	case <-ctx.Done():
		return res, fmt.Errorf("queue ceiling: %d of %d tasks done: %w", done.Load(), tasks, ctx.Err())
	}
	if profPath != "" {
		stopProfile()
		sp, err := analyzeCPUProfile(profPath, tasks)
		if err != nil {
			return res, err
		}
		res.Floor = &sp
	}
	res.TasksPerS = float64(tasks) / end.Sub(start).Seconds()
	slog.Info("queue ceiling", "tasks", tasks, "payload_bytes", res.PayloadBytes,
		"concurrency", concurrency, "tasks_per_s", res.TasksPerS, "enqueue_per_s", res.EnqueuePerS)
	return res, nil
}
