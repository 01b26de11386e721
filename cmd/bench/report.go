package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// row is one line of the report. Ratio is ours / ceiling, 0 when the row is
// a ceiling itself or was not measured.
type row struct {
	Section  string // "queue", "storage", "compute", "e2e", "batching"
	What     string // e.g. "msl-cpu small 8x1024"
	Figure   string // absolute figures, e.g. "1234 jobs/s, 0.41 GB/s"
	Ceiling  string // what the ratio divides by
	Ratio    float64
	HasRatio bool
	Target   string // e.g. ">= 50%", and whether it is met
}

// report is everything one run produced.
type report struct {
	Start   time.Time
	Elapsed time.Duration
	Host    string
	Config  string
	Rows    []row
	Notes   []string
}

func ratioRow(section, what, figure, ceiling string, ours, ceil float64, target float64) row {
	r := row{Section: section, What: what, Figure: figure, Ceiling: ceiling}
	if ceil > 0 && ours > 0 {
		r.Ratio, r.HasRatio = ours/ceil, true
	}
	if target > 0 {
		met := "not met"
		if r.HasRatio && r.Ratio >= target {
			met = "met"
		}
		if !r.HasRatio {
			met = "not measured"
		}
		r.Target = fmt.Sprintf(">= %.0f%%: %s", target*100, met)
	}
	return r
}

func (r row) ratioText() string {
	if !r.HasRatio {
		return "-"
	}
	if r.Ratio < 0.01 {
		return fmt.Sprintf("%.2g%%", r.Ratio*100)
	}
	return fmt.Sprintf("%.1f%%", r.Ratio*100)
}

// printText writes the table for a terminal.
func (rep *report) printText(w io.Writer) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "section\tmeasurement\tfigure\tceiling\tratio\ttarget")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Section, r.What, r.Figure, r.Ceiling, r.ratioText(), r.Target)
	}
	_ = tw.Flush()
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// markdown renders the table as the README shows it.
func (rep *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# rmsgrad benchmark\n\n")
	fmt.Fprintf(&b, "Run %s on %s, %s, took %s.\n\n", rep.Start.UTC().Format(time.RFC3339), mdEscape(rep.Host),
		mdEscape(rep.Config), rep.Elapsed.Round(time.Second))
	b.WriteString("| section | measurement | figure | ceiling | ours / ceiling | target |\n|---|---|---|---|---:|---|\n")
	for _, r := range rep.Rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.Section, mdEscape(r.What), mdEscape(r.Figure),
			mdEscape(r.Ceiling), r.ratioText(), mdEscape(r.Target))
	}
	if len(rep.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range rep.Notes {
			fmt.Fprintf(&b, "- %s\n", mdEscape(n))
		}
	}
	b.WriteString("\n![ratios](bench.png)\n")
	return b.String()
}

// chart draws one horizontal bar per row that has a ratio, in percent.
func (rep *report) chart(path string) error {
	bars, labels, err := rep.bars()
	if err != nil || bars == nil {
		return err
	}
	p := plot.New()
	p.Title.Text = "rmsgrad: ours / ceiling (same run)"
	p.X.Label.Text = "percent of ceiling"
	p.Add(bars)
	p.NominalY(labels...)
	p.X.Min = 0
	h := vg.Length(len(labels))*vg.Points(22) + vg.Points(80)
	if err := p.Save(8*vg.Inch, h, path); err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	return nil
}

// bars is the chart's bar series and its y labels: bar i (counted from the
// bottom) is labels[i]. The rows are reversed so that the chart reads
// top-down in table order; the values are reversed before the bar chart
// takes its copy of them (reversing after NewBarChart once left every label
// on another row's bar). nil when no row has a ratio.
func (rep *report) bars() (*plotter.BarChart, []string, error) {
	var vals plotter.Values
	var labels []string
	for _, r := range slices.Backward(rep.Rows) {
		if r.HasRatio {
			vals = append(vals, r.Ratio*100)
			labels = append(labels, r.Section+": "+r.What)
		}
	}
	if len(vals) == 0 {
		return nil, nil, nil
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(14))
	if err != nil {
		return nil, nil, fmt.Errorf("chart: %w", err)
	}
	bars.Horizontal = true
	return bars, labels, nil
}

// write puts bench.md, bench.png and a timestamped copy of the Markdown
// into dir.
func (rep *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report dir: %w", err)
	}
	md := rep.markdown()
	if err := os.WriteFile(filepath.Join(dir, "bench.md"), []byte(md), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	stamp := rep.Start.UTC().Format("20060102T150405Z")
	if err := os.WriteFile(filepath.Join(dir, "bench-"+stamp+".md"), []byte(md), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return rep.chart(filepath.Join(dir, "bench.png"))
}
