package faults

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// floodLimit is the stated bound on the worker's peak RSS for a budget:
// the worker keeps its CPU buffers (in use and pooled) within 1.25 x the
// budget and sets Go's soft memory limit to 1.5 x budget + 64 MiB
// (cmd/worker/memory.go); on top of that heap come about 32 MiB the soft
// limit does not count or cannot hold to at once: goroutine stacks, the
// binary, memory freed but not yet returned to the OS. The header budget
// (limits.header_budget_bytes) adds to it: TestHeaderFlood. Here the
// inputs' headers are a few hundred bytes, under the size Head charges.
func floodLimit(budget int64) int64 { return budget + budget/2 + 64<<20 + 32<<20 }

var inFlightRe = regexp.MustCompile(`(?m)^rmsgrad_bytes_in_flight ([0-9.e+]+)$`)

// TestFlood enqueues 2,000 large jobs at once (0.75-2 MiB per tensor,
// twelve shapes) on a worker whose memory budget holds only a handful of
// them. Every job that fits must complete
// with the clean run's outputs; one job that can never fit must be
// rejected at once; bytes in flight must stay within budget_bytes while
// reaching at least half of it; and the worker's peak RSS (VmHWM) must stay
// within floodLimit. Twelve shapes in distinct size classes make a pool
// that keeps buffers per shape show: before the pool was bounded by the
// budget, this flood peaked at 179 MiB.
func TestFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 2,000 large jobs")
	}
	t.Parallel()
	e := NewEnv(t)
	ins := e.Inputs(t, "flood", 41, [2]int{64, 4096}, [2]int{128, 2048}, [2]int{96, 4096}, [2]int{32, 8192},
		[2]int{256, 1024}, [2]int{48, 4096}, [2]int{80, 4096}, [2]int{112, 4096}, [2]int{72, 4096}, [2]int{88, 4096}, [2]int{104, 4096}, [2]int{120, 4096})
	huge := e.Inputs(t, "flood-huge", 42, [2]int{1024, 4096})[0] // 16 MiB per tensor: never fits
	const budget = 32 << 20
	const n = 2000
	w := StartWorker(t, workerBin, e, WorkerConfig{Name: "w", BudgetBytes: budget})
	time.Sleep(500 * time.Millisecond)
	idle, _, err := Memory(w.PID())
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	js := make([]jobs.Job, n)
	outs := make([][]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("flood-%04d", i)
		outs[i] = []string{"dw", "r"}
		if i%10 == 0 {
			outs[i] = []string{"dx", "dw", "r"}
		}
		js[i] = ins[i%len(ins)].Job(outURI(ids[i]), outs[i]...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// Sample bytes in flight while the flood drains.
	var maxInFlight float64
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if m, err := w.Metrics(); err == nil {
				if sm := inFlightRe.FindStringSubmatch(m); sm != nil {
					v, _ := strconv.ParseFloat(sm[1], 64)
					maxInFlight = max(maxInFlight, v)
				}
			}
		}
	}()
	start := time.Now()
	if err := e.EnqueueAll(ctx, ids, js, 16); err != nil {
		t.Fatal(err)
	}
	enqueued := time.Since(start)
	hugeID := "flood-huge"
	if err := e.EnqueueAll(ctx, []string{hugeID}, []jobs.Job{huge.Job(outURI(hugeID))}, 1); err != nil {
		t.Fatal(err)
	}
	f, err := e.WaitFinal(ctx, append(ids, hugeID))
	took := time.Since(start)
	close(stop)
	<-sampled
	if err != nil {
		t.Fatalf("%v; lost %v", err, first(f.Lost, 10))
	}
	_, peak, err := Memory(w.PID())
	if err != nil {
		t.Fatal(err)
	}
	if msg, ok := f.Archived[hugeID]; !ok || !strings.Contains(msg, "never fit") || !strings.Contains(msg, strconv.Itoa(budget)) {
		t.Fatalf("the job that can never fit: archived=%v message %q, want it rejected naming the budget %d", ok, msg, budget)
	}
	delete(f.Archived, hugeID)
	if len(f.Lost) > 0 || len(f.Archived) > 0 {
		t.Fatalf("%d jobs lost (%v), %d that fit were archived (%v)", len(f.Lost), first(f.Lost, 5), len(f.Archived), f.Archived)
	}
	for i, id := range ids {
		in := ins[i%len(ins)]
		if err := CheckResult(f.Results[id], in, outURI(id), outs[i]...); err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
		if i%50 == 0 {
			if err := e.CheckObject(ctx, in, outURI(id), outs[i]...); err != nil {
				t.Fatalf("job %s: %v", id, err)
			}
		}
	}
	if maxInFlight > budget || maxInFlight < budget/2 {
		t.Fatalf("bytes in flight peaked at %.0f, want within (budget/2, budget] = (%d, %d]: the budget must bind and hold", maxInFlight, budget/2, budget)
	}
	limit := headerFloodLimit(budget, 64<<20) // the worker's default header budget
	mib := func(v int64) float64 { return float64(v) / (1 << 20) }
	if peak > limit {
		t.Fatalf("peak RSS %.1f MiB over the stated %.1f MiB (1.5 x budget %.1f + 96 MiB; idle RSS %.1f MiB)", mib(peak), mib(limit), mib(budget), mib(idle))
	}
	if err := w.Term(60 * time.Second); err != nil {
		t.Fatalf("worker after SIGTERM: %v", err)
	}
	t.Logf("FIGURE flood jobs=%d lost=%d rejected_fitting=%d budget_mib=%.0f max_in_flight_mib=%.1f idle_rss_mib=%.1f peak_rss_mib=%.1f peak_minus_budget_mib=%.1f limit_mib=%.1f enqueue_s=%.1f drain_s=%.1f",
		n, len(f.Lost), len(f.Archived), mib(budget), maxInFlight/(1<<20), mib(idle), mib(peak), mib(peak-budget), mib(limit), enqueued.Seconds(), took.Seconds())
}
