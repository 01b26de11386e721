package jobs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
)

// TestFetchers runs a queue with several fetch loops on a real Redis:
// that many asynq servers on the same queue, each with its share of the
// concurrency; every task runs exactly once, and never more than the
// worker's concurrency at a time. Fetchers 0 runs AutoFetchLoops.
func TestFetchers(t *testing.T) {
	for _, c := range []struct{ fetchers, conc, servers int }{{3, 6, 3}, {0, 16, AutoFetchLoops}, {1, 4, 1}} {
		t.Run(fmt.Sprintf("fetchers=%d", c.fetchers), func(t *testing.T) { testFetchers(t, c.fetchers, c.conc, c.servers) })
	}
}

func testFetchers(t *testing.T, fetchers, conc, servers int) {
	rs := testenv.Redis(t)
	r := asynq.RedisClientOpt{Addr: rs.Addr}
	const n = 120
	srv := NewServers(r, ServersConfig{Queues: map[string]int{DefaultQueue: 1}, Fetchers: fetchers, Server: asynq.Config{
		Concurrency: conc, LogLevel: asynq.WarnLevel, TaskCheckInterval: 20 * time.Millisecond, ShutdownTimeout: 10 * time.Second}})
	var mu sync.Mutex
	runs := map[string]int{}
	var active, peak atomic.Int64
	mux := asynq.NewServeMux()
	mux.HandleFunc("fetchers-test", func(ctx context.Context, task *asynq.Task) error {
		a := active.Add(1)
		defer active.Add(-1)
		for {
			p := peak.Load()
			if a <= p || peak.CompareAndSwap(p, a) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		runs[string(task.Payload())]++
		mu.Unlock()
		return nil
	})
	if err := srv.Start(context.Background(), mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	insp := asynq.NewInspector(r)
	defer insp.Close()
	var infos []*asynq.ServerInfo
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		if infos, err = insp.Servers(); err == nil && len(infos) == servers {
			break
		}
	}
	if len(infos) != servers {
		t.Fatalf("asynq servers registered: %d, want %d (one per fetch loop)", len(infos), servers)
	}
	for _, si := range infos {
		if si.Concurrency != conc/servers || si.Queues[DefaultQueue] != 1 {
			t.Fatalf("server %s: concurrency %d, queues %v; want %d on %s", si.ID, si.Concurrency, si.Queues, conc/servers, DefaultQueue)
		}
	}

	cl := asynq.NewClient(r)
	defer cl.Close()
	for i := range n {
		if _, err := cl.Enqueue(asynq.NewTask("fetchers-test", fmt.Appendf(nil, "t%03d", i)), asynq.Queue(DefaultQueue), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		qi, err := insp.GetQueueInfo(DefaultQueue)
		if err == nil && qi.Completed+qi.Processed >= n && qi.Active == 0 && qi.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue after 30s: %+v (%v)", qi, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != n {
		t.Fatalf("%d distinct tasks ran, want %d", len(runs), n)
	}
	for k, c := range runs {
		if c != 1 {
			t.Fatalf("task %s ran %d times, want 1", k, c)
		}
	}
	if p := peak.Load(); p > int64(conc) {
		t.Fatalf("peak %d tasks at once, over the worker's concurrency %d", p, conc)
	}
}
