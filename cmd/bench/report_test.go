package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// TestChartBars: each bar of the chart carries its own row's ratio, and
// the chart reads top-down in table order (the bottom bar is the last row
// with a ratio). Rows without a ratio get no bar. It also writes the PNG.
func TestChartBars(t *testing.T) {
	rep := &report{Rows: []row{
		{Section: "compute", What: "a", Ratio: 0.10, HasRatio: true},
		{Section: "storage", What: "ceiling", Figure: "no ratio"},
		{Section: "e2e", What: "b", Ratio: 0.55, HasRatio: true},
		{Section: "batching", What: "c", Ratio: 1.20, HasRatio: true},
	}}
	bars, labels, err := rep.bars()
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := []string{"batching: c", "e2e: b", "compute: a"}
	wantVals := []float64{120, 55, 10}
	if !slices.Equal(labels, wantLabels) {
		t.Fatalf("labels (bottom up) %q, want %q", labels, wantLabels)
	}
	if len(bars.Values) != len(wantVals) {
		t.Fatalf("%d bars, want %d", len(bars.Values), len(wantVals))
	}
	for i, v := range bars.Values {
		if v < wantVals[i]-1e-9 || v > wantVals[i]+1e-9 {
			t.Errorf("bar %d (label %q) is %.2f%%, want %.2f%%", i, labels[i], v, wantVals[i])
		}
	}
	path := filepath.Join(t.TempDir(), "bench.png")
	if err := rep.chart(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 8 || string(b[1:4]) != "PNG" {
		t.Fatalf("chart wrote %d bytes (err %v), want a PNG", len(b), err)
	}
	empty := &report{Rows: []row{{Section: "queue", What: "ceiling"}}}
	if bars, _, err := empty.bars(); bars != nil || err != nil {
		t.Fatalf("a report without ratios gave bars %v, err %v; want none", bars, err)
	}
}

// TestStagesRow: the handler slot's cycle is slots / jobs/s, the time
// outside the handler is the cycle minus the handler's total, both as
// medians over the runs; a run without sampled results gives no row.
func TestStagesRow(t *testing.T) {
	run := func(jps, total, fetch float64) e2eResult {
		return e2eResult{JobsPerS: jps, Sampled: 2000, Stages: jobs.Timings{Fetch: fetch, Batch: 1, Compute: 0.1, Store: 0.5, Total: total}}
	}
	// Cycles 64/8000 = 8 ms, 64/6400 = 10 ms, 64/16000 = 4 ms: median 8.
	defs := []e2eResult{run(8000, 5, 2), run(6400, 6, 3), run(16000, 1, 0.5)}
	r, ok := stagesRow("small:", defs, 64)
	if !ok {
		t.Fatal("no row for runs with results")
	}
	for _, want := range []string{"fetch 2.00, batch_wait 1.00, compute 0.10, store 0.50; handler total 5.00", "8.00 ms, of which 3.00 ms (38%) outside"} {
		if !strings.Contains(r.Figure+" "+r.Ceiling, want) {
			t.Errorf("row %q / %q lacks %q", r.Figure, r.Ceiling, want)
		}
	}
	defs[1].Sampled = 0
	if _, ok := stagesRow("small:", defs, 64); ok {
		t.Error("a row for runs of which one has no results")
	}
}

// TestStoreMixRow: the ratio is the median of the rounds' end-to-end
// jobs/s over the store mix's of the same round (not the ratio of the
// medians), and rounds that do not pair up give no row.
func TestStoreMixRow(t *testing.T) {
	defs := []e2eResult{{JobsPerS: 8000}, {JobsPerS: 9000}, {JobsPerS: 3000}}
	mix := []storeMixResult{{JobsPerS: 16000, Jobs: 100}, {JobsPerS: 15000, Jobs: 100}, {JobsPerS: 4000, Jobs: 100}}
	ceil := []storageResult{{GetPerS: 30000, PutPerS: 15000}, {GetPerS: 30000, PutPerS: 15000}, {GetPerS: 30000, PutPerS: 15000}}
	r, ok := storeMixRow(defs, mix, ceil, 64)
	if !ok || !r.HasRatio {
		t.Fatal("no row or no ratio for paired rounds")
	}
	// Rounds: 50%, 60%, 75%; median 60% (the medians' ratio would be 8000/15000).
	if r.Ratio < 0.6-1e-9 || r.Ratio > 0.6+1e-9 {
		t.Errorf("ratio %.4f, want 0.6", r.Ratio)
	}
	for _, want := range []string{"rounds: 50%, 60%, 75%", "store alone 15000 jobs/s, 2.00x the minio-go ceiling of the same rounds (7500 jobs/s)"} {
		if !strings.Contains(r.What+" "+r.Figure, want) {
			t.Errorf("row %q / %q lacks %q", r.What, r.Figure, want)
		}
	}
	if _, ok := storeMixRow(defs[:2], mix, ceil, 64); ok {
		t.Error("a row for rounds that do not pair up")
	}
}

// TestVariantSlots: a variant that sets the worker's concurrency is read
// at its own slot count; any other variant at the default.
func TestVariantSlots(t *testing.T) {
	for kv, want := range map[string]int{
		"RMSGRAD_CONCURRENCY=128": 128,
		"RMSGRAD_PROCS=4":         64,
		"RMSGRAD_CONCURRENCY=x":   64,
		"RMSGRAD_CONCURRENCY=0":   64,
		"GOGC=400":                64,
	} {
		if got := variantSlots(kv, 64); got != want {
			t.Errorf("variantSlots(%q) = %d, want %d", kv, got, want)
		}
	}
}

// TestRedisStats: INFO commandstats lines parse into calls and usec, the
// difference of two reads keeps only commands called in between, and the
// figure gives the mean a job over runs of different sizes, top first.
func TestRedisStats(t *testing.T) {
	a := parseCmdStats("# Commandstats\r\ncmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\ncmdstat_ping:calls=3,usec=3,usec_per_call=1.00\r\n")
	b := parseCmdStats("# Commandstats\r\ncmdstat_evalsha:calls=410,usec=4100,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\ncmdstat_ping:calls=3,usec=3,usec_per_call=1.00\r\ncmdstat_hset:calls=200,usec=400,usec_per_call=2.00\r\n")
	if got := a["evalsha"]; got != (cmdStat{10, 100}) {
		t.Fatalf("evalsha parsed as %+v", got)
	}
	d := cmdStatsSince(a, b)
	if len(d) != 2 || d["evalsha"] != (cmdStat{400, 4000}) || d["hset"] != (cmdStat{200, 400}) {
		t.Fatalf("difference %+v, want evalsha 400/4000 and hset 200/400 only", d)
	}
	// Run 1: 200 jobs (2 evalsha, 20 us; 1 hset, 2 us a job); run 2: 100
	// jobs, 4 evalsha (40 us) a job. Means: evalsha 3 (30 us), hset 0.5 (1 us).
	f := redisFigure([]map[string]cmdStat{d, {"evalsha": {400, 4000}}}, []int{200, 100}, 8)
	if want := "evalsha 3.00 (30.0 us), hset 0.50 (1.0 us); in all 3.5 calls, 31 us a job"; f != want {
		t.Errorf("figure %q, want %q", f, want)
	}
}
