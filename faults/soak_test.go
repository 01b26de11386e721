package faults

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSoak runs 10,000 small jobs through one worker with 64 jobs
// outstanding at all times (64 orchestrator loops: enqueue, wait, next).
// One job in 20 is a duplicate of an earlier job (same inputs, same
// output, its own task id). None may be lost, every result must carry the
// clean run's sha256, duplicates must agree, and the p50/p99 latency is
// reported: worker-measured (enqueue to output stored, from the result's
// queue_wait + total) and client-observed (Enqueue to Wait returning,
// which includes Wait's polling).
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 10,000 jobs")
	}
	t.Parallel()
	e := NewEnv(t)
	var shapes [][2]int
	for i := range 16 {
		shapes = append(shapes, [2]int{1 + i%4*3, []int{16, 32, 64, 128}[i/4]})
	}
	ins := e.Inputs(t, "soak", 51, shapes...)
	w := StartWorker(t, workerBin, e, WorkerConfig{Name: "w", Concurrency: 64, MaxJobs: 32, LogLevel: "warn"})
	const n, conc = 10000, 64
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// Job i writes out i, except every 20th, which repeats job i-10.
	outOf := func(i int) int {
		if i%20 == 19 {
			return i - 10
		}
		return i
	}
	id := func(i int) string { return fmt.Sprintf("soak-%05d", i) }
	client := make([]float64, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				o := outOf(i)
				t0 := time.Now()
				if _, err := e.Client.Enqueue(ctx, ins[o%len(ins)].Job(outURI(id(o))), taskID(id(i))); err != nil {
					errs <- fmt.Errorf("enqueue %s: %w", id(i), err)
					return
				}
				if _, err := e.Client.Wait(ctx, id(i)); err != nil {
					errs <- fmt.Errorf("wait %s: %w", id(i), err)
					return
				}
				client[i] = float64(time.Since(t0).Microseconds()) / 1000
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = id(i)
	}
	f, err := e.WaitFinal(ctx, ids)
	if err != nil {
		t.Fatalf("%v; lost %v", err, first(f.Lost, 10))
	}
	if len(f.Lost) > 0 || len(f.Archived) > 0 {
		t.Fatalf("%d jobs lost (%v), %d archived (%v)", len(f.Lost), first(f.Lost, 5), len(f.Archived), f.Archived)
	}
	worker := make([]float64, 0, n)
	var queue, fetch, batch, store []float64
	dups, batches := 0, map[int]int{}
	for i := range n {
		o := outOf(i)
		in := ins[o%len(ins)]
		res := f.Results[id(i)]
		if err := CheckResult(res, in, outURI(id(o))); err != nil {
			t.Fatalf("job %s: %v", id(i), err)
		}
		if o != i {
			dups++
			if !maps.Equal(res.SHA256, f.Results[id(o)].SHA256) {
				t.Fatalf("duplicate %s of %s: sha256 %v, the original's %v", id(i), id(o), res.SHA256, f.Results[id(o)].SHA256)
			}
			if dups%25 == 0 {
				if err := e.CheckObject(ctx, in, outURI(id(o))); err != nil {
					t.Fatalf("duplicated output of %s: %v", id(o), err)
				}
			}
		}
		worker = append(worker, res.Timings.QueueWait+res.Timings.Total)
		queue, fetch = append(queue, res.Timings.QueueWait), append(fetch, res.Timings.Fetch)
		batch, store = append(batch, res.Timings.Batch), append(store, res.Timings.Store)
		batches[res.BatchJobs]++
	}
	for _, v := range [][]float64{worker, client, queue, fetch, batch, store} {
		slices.Sort(v)
	}
	multi := 0
	for size, c := range batches {
		if size > 1 {
			multi += c
		}
	}
	if multi == 0 {
		t.Fatalf("no batch of more than one job in the soak: %v", batches)
	}
	if err := w.Term(60 * time.Second); err != nil {
		t.Fatalf("worker after SIGTERM: %v", err)
	}
	t.Logf("FIGURE soak jobs=%d concurrency=%d duplicates=%d lost=%d archived=%d p50=%.1fms p99=%.1fms max=%.1fms client_p50=%.1fms client_p99=%.1fms jobs_per_s=%.0f batched_jobs=%d stage_p50_ms=queue:%.1f,fetch:%.1f,batch:%.1f,store:%.1f",
		n, conc, dups, len(f.Lost), len(f.Archived), Percentile(worker, 50), Percentile(worker, 99), worker[len(worker)-1],
		Percentile(client, 50), Percentile(client, 99), float64(n)/took.Seconds(), multi,
		Percentile(queue, 50), Percentile(fetch, 50), Percentile(batch, 50), Percentile(store, 50))
}
