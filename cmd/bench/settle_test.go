package main

import (
	"strings"
	"testing"
	"time"
)

const meminfoSample = `MemTotal:        8131212 kB
MemFree:          312840 kB
MemAvailable:    6270048 kB
Buffers:          143612 kB
Cached:          5619476 kB
Dirty:           2401280 kB
Writeback:         10240 kB
AnonPages:       1601464 kB
WritebackTmp:          0 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
`

func TestParseDirty(t *testing.T) {
	got, err := parseDirty([]byte(meminfoSample))
	if err != nil {
		t.Fatal(err)
	}
	// WritebackTmp must not be taken for Writeback.
	if want := int64(2401280+10240) << 10; got != want {
		t.Fatalf("parseDirty = %d, want %d", got, want)
	}

	for _, c := range []struct {
		name, text, wantErr string
	}{
		{"no Dirty", strings.Replace(meminfoSample, "Dirty:           2401280 kB\n", "", 1), "no Dirty line"},
		{"no Writeback", strings.Replace(meminfoSample, "Writeback:         10240 kB\n", "", 1), "no Writeback line"},
		{"empty", "", "no Dirty line"},
		{"other unit", strings.Replace(meminfoSample, "2401280 kB", "2401280 MB", 1), "want \"N kB\""},
		{"not a number", strings.Replace(meminfoSample, "10240 kB", "x kB", 1), "not a size"},
	} {
		if d, err := parseDirty([]byte(c.text)); err == nil || !strings.Contains(err.Error(), c.wantErr) || d != -1 {
			t.Errorf("%s: parseDirty = %d, %v; want -1 and an error with %q", c.name, d, err, c.wantErr)
		}
	}
}

func TestSettleNote(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {2345, "2,345"}, {1234567, "1,234,567"}, {-1234, "-1,234"}} {
		if got := groupDigits(c.n); got != c.want {
			t.Errorf("groupDigits(%d) = %q, want %q", c.n, got, c.want)
		}
	}
	small := []settled{{Dirty: 2345 << 20, Sync: 1900 * time.Millisecond}, {Dirty: 3 << 20, Sync: 12 * time.Millisecond}, {Dirty: -1, Sync: 0}}
	large := settled{Dirty: 100 << 20, Sync: 2500 * time.Millisecond}
	got := settleNote(small, &large)
	for _, want := range []string{
		"round 1: 2,345 MiB dirty, sync 1.9 s; round 2: 3 MiB dirty, sync 12 ms; round 3: dirty unknown, sync 0 ms",
		"; before the first large round's F32 run: 100 MiB dirty, sync 2.5 s.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("settleNote = %q, want it to hold %q", got, want)
		}
	}
	if got := settleNote(small[:1], nil); strings.Contains(got, "large") || !strings.HasSuffix(got, "sync 1.9 s.") {
		t.Errorf("settleNote without a large round = %q", got)
	}
}

// TestBF16CeilingRows: the BF16 run against the BF16-size ceiling of its
// round, and the two ceilings' ratio per round; medians in the ratio
// column, no target.
func TestBF16CeilingRows(t *testing.T) {
	s := shape{Name: "large", Rows: 4096, Dim: 4096, Jobs: 48}
	// JobsPerS() = 1/(2/GET + 1/PUT): GET = PUT = 3x gives x jobs/s.
	ceil := func(x float64) storageResult { return storageResult{GetPerS: 3 * x, PutPerS: 3 * x} }
	halfs := []e2eResult{{JobsPerS: 8}, {JobsPerS: 9}, {JobsPerS: 6}}
	f32 := []storageResult{ceil(5), ceil(6), ceil(4)}
	bf16 := []storageResult{ceil(10), ceil(9), ceil(8)}
	rows := bf16CeilingRows(s, halfs, f32, bf16)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2", len(rows))
	}
	r := rows[0]
	if want := "large 4096x4096 BF16 (median of 3; rounds: 80%, 100%, 75%)"; r.What != want {
		t.Errorf("What %q, want %q", r.What, want)
	}
	if !r.HasRatio || r.Ratio < 0.8-1e-9 || r.Ratio > 0.8+1e-9 || r.Target != "" {
		t.Errorf("BF16 row ratio %v (has %v), target %q; want 80%%, no target", r.Ratio, r.HasRatio, r.Target)
	}
	if !strings.Contains(r.Ceiling, "BF16 object sizes (32 MiB)") {
		t.Errorf("BF16 row ceiling %q", r.Ceiling)
	}
	c := rows[1]
	if want := "storage alone: ceiling at BF16 sizes vs F32 sizes (rounds: 2.00x, 1.50x, 2.00x)"; c.What != want {
		t.Errorf("What %q, want %q", c.What, want)
	}
	if !c.HasRatio || c.Ratio < 2-1e-9 || c.Ratio > 2+1e-9 || c.Target != "" {
		t.Errorf("ceiling row ratio %v (has %v), target %q; want 200%%, no target", c.Ratio, c.HasRatio, c.Target)
	}
	if want := "9 vs 5 jobs/s (medians of 3 rounds; 2 GET + 1 PUT of 32 MiB vs 64 MiB)"; c.Figure != want {
		t.Errorf("Figure %q, want %q", c.Figure, want)
	}
	md := (&report{Rows: rows}).markdown()
	if !strings.Contains(md, "| e2e | storage alone: ceiling at BF16 sizes vs F32 sizes (rounds: 2.00x, 1.50x, 2.00x) | ") ||
		!strings.Contains(md, "| 200.0% |  |") {
		t.Errorf("markdown:\n%s", md)
	}
}

// coldRows: each pass ratio and the BF16-vs-F32 ratio of the first passes
// come from the rounds' own runs; runs without a first pass give no rows.
func TestColdRows(t *testing.T) {
	s := shape{Name: "large", Rows: 4096, Dim: 4096, Jobs: 48}
	run := func(warm, cold float64) e2eResult {
		return e2eResult{JobsPerS: warm, Cold: &e2eResult{JobsPerS: cold}}
	}
	f32 := []e2eResult{run(40, 30), run(38, 20), run(39, 28)}
	bf16 := []e2eResult{run(90, 45), run(88, 50), run(92, 42)}
	rows := coldRows(s, f32, bf16)
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3", len(rows))
	}
	approx := func(r row, want float64) bool { return r.HasRatio && r.Ratio > want-1e-9 && r.Ratio < want+1e-9 }
	if want := "large 4096x4096 F32, a fresh worker's first 48 jobs (cold) vs the next 48 (jobs/s 30/20/28 vs 40/38/39)"; rows[0].What != want {
		t.Errorf("F32 row %q, want %q", rows[0].What, want)
	}
	if !approx(rows[0], 28.0/39) {
		t.Errorf("F32 cold/warm ratio %v, want median 28 / median 39", rows[0].Ratio)
	}
	if !approx(rows[1], 45.0/90) {
		t.Errorf("BF16 cold/warm ratio %v, want median 45 / median 90", rows[1].Ratio)
	}
	// Per round: 45/30 = 1.5, 50/20 = 2.5, 42/28 = 1.5.
	if want := "large 4096x4096, every tensor BF16 vs F32, cold first passes (median of 3; rounds: 1.50x, 2.50x, 1.50x)"; rows[2].What != want {
		t.Errorf("ratio row %q, want %q", rows[2].What, want)
	}
	if !approx(rows[2], 1.5) || rows[2].Target != "" {
		t.Errorf("cold BF16 vs F32 ratio %v target %q, want 1.5 and no target", rows[2].Ratio, rows[2].Target)
	}
	f32[1].Cold = nil
	if rows := coldRows(s, f32, bf16); rows != nil {
		t.Errorf("a run without a first pass: %d rows, want none", len(rows))
	}
	if got := colds(f32); len(got) != 2 || got[0].JobsPerS != 30 || got[1].JobsPerS != 28 {
		t.Errorf("colds = %+v, want the two first passes", got)
	}
}

// streamColdRow: the cold passes against each round's own ceiling, the
// median of those ratios, and no row when a round lacks a cold pass or a
// ceiling; window names the timed jobs of a Stream class only.
func TestStreamColdRow(t *testing.T) {
	s := shape{Name: "small", Rows: 8, Dim: 1024, Jobs: 2000, Stream: true}
	if got, want := s.window(), "timed on a busy worker: 2000 jobs, once its first 2000 are done and their writes synced, of 8000 posted"; got != want {
		t.Errorf("window %q, want %q", got, want)
	}
	if w := (shape{Name: "large", Jobs: 48}).window(); w != "" {
		t.Errorf("a class without Stream: window %q, want none", w)
	}
	// A ceiling of 2 GETs and 1 PUT a job: GET 4n/s and PUT 2n/s give n jobs/s.
	ceil := func(n float64) storageResult { return storageResult{GetPerS: 4 * n, PutPerS: 2 * n} }
	run := func(warm, cold float64) e2eResult {
		return e2eResult{JobsPerS: warm, Cold: &e2eResult{JobsPerS: cold}}
	}
	defs := []e2eResult{run(8000, 5000), run(9000, 7200), run(8500, 8000)}
	ceils := []storageResult{ceil(10000), ceil(9000), ceil(10000)}
	r, ok := streamColdRow(s, defs, ceils)
	if !ok {
		t.Fatal("no row")
	}
	// Per round: 5000/10000, 7200/9000, 8000/10000.
	if want := "small 8x1024, default batching, a fresh worker's first 2000 jobs, timed from its start line (cold; median of 3; rounds: 50%, 80%, 80%; jobs/s 5000/7200/8000, then 8000/9000/8500 in the window above)"; r.What != want {
		t.Errorf("row %q,\nwant %q", r.What, want)
	}
	if !r.HasRatio || r.Ratio < 0.8-1e-9 || r.Ratio > 0.8+1e-9 || r.Target != "" {
		t.Errorf("ratio %v target %q, want the median 0.8 and no target", r.Ratio, r.Target)
	}
	defs[1].Cold = nil
	if _, ok := streamColdRow(s, defs, ceils); ok {
		t.Error("a round without a cold pass gave a row")
	}
	if _, ok := streamColdRow(s, defs[:2], ceils); ok {
		t.Error("rounds and ceilings of different counts gave a row")
	}
}

func TestHigherCeiling(t *testing.T) {
	low := storageResult{GetPerS: 20000, PutPerS: 10000}  // 5,000 jobs/s
	high := storageResult{GetPerS: 40000, PutPerS: 10000} // 6,667 jobs/s
	if got := higherCeiling(low, high); got.GetPerS != high.GetPerS {
		t.Errorf("higherCeiling(low, high) = %v jobs/s, want the after measurement", got.JobsPerS())
	}
	if got := higherCeiling(high, low); got.GetPerS != high.GetPerS {
		t.Errorf("higherCeiling(high, low) = %v jobs/s, want the before measurement", got.JobsPerS())
	}
	// A failed measurement (no GETs) counts as 0 jobs/s and never wins.
	if got := higherCeiling(storageResult{}, low); got.GetPerS != low.GetPerS {
		t.Errorf("higherCeiling(empty, low) picked the empty measurement")
	}
	n := ceilingPairsNote([][2]float64{{5000, 6667}, {7001.4, 6999.6}})
	for _, want := range []string{"round 1: 5000 before, 6667 after", "round 2: 7001 before, 7000 after", "divide by the higher"} {
		if !strings.Contains(n, want) {
			t.Errorf("note %q lacks %q", n, want)
		}
	}
}
