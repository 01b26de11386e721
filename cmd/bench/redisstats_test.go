package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
)

// TestQueueCounter: the bench's poll reads the same completed, retry and
// archived counts as asynq's Inspector, on a real redis-server with tasks
// in each state: it names asynq's keys itself, so an asynq upgrade that
// moved them would fail here rather than leave a run waiting.
func TestQueueCounter(t *testing.T) {
	rs := testenv.Redis(t)
	rc := asynq.RedisClientOpt{Addr: rs.Addr}
	const queue = "qc-test"
	cl := asynq.NewClient(rc)
	defer cl.Close()
	enq := func(kind string, n int, opts ...asynq.Option) {
		for range n {
			if _, err := cl.Enqueue(asynq.NewTask(kind, nil), append(opts, asynq.Queue(queue), asynq.Retention(time.Hour))...); err != nil {
				t.Fatal(err)
			}
		}
	}
	enq("ok", 5)
	enq("fail", 2, asynq.MaxRetry(0))
	enq("fail", 3, asynq.MaxRetry(5))
	srv := asynq.NewServer(rc, asynq.Config{Concurrency: 4, Queues: map[string]int{queue: 1}, LogLevel: asynq.ErrorLevel,
		TaskCheckInterval: 20 * time.Millisecond, RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour }})
	mux := asynq.NewServeMux()
	mux.HandleFunc("ok", func(context.Context, *asynq.Task) error { return nil })
	mux.HandleFunc("fail", func(context.Context, *asynq.Task) error { return errors.New("planned failure") })
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	qc := newQueueCounter(rs.Addr)
	defer qc.Close()
	insp := asynq.NewInspector(rc)
	defer insp.Close()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, r, a, err := qc.counts(ctx, queue)
		if err != nil {
			t.Fatal(err)
		}
		if c == 5 && r == 3 && a == 2 {
			qi, err := insp.GetQueueInfo(queue)
			if err != nil {
				t.Fatal(err)
			}
			if int64(qi.Completed) != c || int64(qi.Retry) != r || int64(qi.Archived) != a {
				t.Fatalf("counter %d/%d/%d, Inspector %d/%d/%d (completed/retry/archived)", c, r, a, qi.Completed, qi.Retry, qi.Archived)
			}
			return
		}
		if time.Now().After(deadline) {
			qi, _ := insp.GetQueueInfo(queue)
			t.Fatalf("counter at %d/%d/%d, want 5/3/2 (Inspector: %+v)", c, r, a, qi)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
