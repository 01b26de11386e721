package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
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
