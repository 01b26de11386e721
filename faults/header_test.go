package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// headerFloodLimit is the stated bound on the worker's peak RSS: floodLimit
// for the tensor budget plus the header budget, which bounds the headers
// being read and parsed at once (limits.header_budget_bytes).
func headerFloodLimit(budget, headerBudget int64) int64 { return floodLimit(budget) + headerBudget }

// TestHeaderFlood: 32 jobs at once, each of whose input objects has a
// header at the worker's max_header_bytes (8 MiB of metadata keys, the
// shape that makes the parser allocate most per byte that a writer can
// produce). Each such header takes up to safetensors.ParseCost of its
// length, 128 MiB, to read and parse, so without a bound the flood would
// take some 4 GiB; with a header budget of two such headers, peak RSS must
// stay within the stated bound, and every job must complete with the
// clean run's outputs.
func TestHeaderFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 32 jobs with 8 MiB headers")
	}
	t.Parallel()
	e := NewEnv(t)
	const maxHeader = 8 << 20
	meta := map[string]string{}
	for i := 0; ; i++ {
		meta[fmt.Sprintf("k%07d", i)] = "v"
		if 16*len(meta) > maxHeader-64<<10 { // each key is 16 bytes of JSON
			break
		}
	}
	const n = 32
	shapes := make([][2]int, n)
	for i := range shapes {
		shapes[i] = [2]int{8 + i%4, 256}
	}
	ins := e.InputsMeta(t, "hdr", 51, meta, shapes...)
	cost := safetensors.ParseCost(maxHeader)
	const budget = 32 << 20
	headerBudget := 2 * cost
	w := StartWorker(t, workerBin, e, WorkerConfig{Name: "w", BudgetBytes: budget, MaxHeaderBytes: maxHeader, HeaderBudget: headerBudget})
	time.Sleep(500 * time.Millisecond)
	idle, _, err := Memory(w.PID())
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	js := make([]jobs.Job, n)
	for i := range n {
		ids[i] = fmt.Sprintf("hdr-%02d", i)
		js[i] = ins[i].Job(outURI(ids[i]))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if err := e.EnqueueAll(ctx, ids, js, 8); err != nil {
		t.Fatal(err)
	}
	f, err := e.WaitFinal(ctx, ids)
	if err != nil {
		t.Fatalf("%v; lost %v", err, first(f.Lost, 10))
	}
	took := time.Since(start)
	_, peak, err := Memory(w.PID())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Lost) > 0 || len(f.Archived) > 0 {
		t.Fatalf("%d jobs lost (%v), %d archived (%v)", len(f.Lost), first(f.Lost, 5), len(f.Archived), f.Archived)
	}
	for i, id := range ids {
		if err := CheckResult(f.Results[id], ins[i], outURI(id)); err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
	}
	if err := e.CheckObject(ctx, ins[0], outURI(ids[0])); err != nil {
		t.Fatal(err)
	}
	limit := headerFloodLimit(budget, headerBudget)
	mib := func(v int64) float64 { return float64(v) / (1 << 20) }
	if peak > limit {
		t.Fatalf("peak RSS %.1f MiB over the stated %.1f MiB (1.5 x budget %.0f + header budget %.0f + 96 MiB; idle %.1f MiB)", mib(peak), mib(limit), mib(budget), mib(headerBudget), mib(idle))
	}
	if err := w.Term(60 * time.Second); err != nil {
		t.Fatalf("worker after SIGTERM: %v", err)
	}
	t.Logf("FIGURE header-flood jobs=%d header_bytes=%d parse_cost_mib=%.0f unbounded_mib=%.0f budget_mib=%.0f header_budget_mib=%.0f idle_rss_mib=%.1f peak_rss_mib=%.1f limit_mib=%.1f took_s=%.1f",
		n, maxHeader, mib(cost), mib(int64(n)*cost), mib(budget), mib(headerBudget), mib(idle), mib(peak), mib(limit), took.Seconds())
}
