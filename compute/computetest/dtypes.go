package computetest

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

// mixShapes are the shapes every dtype mix runs on: dim 1, a row shorter
// than one vector of lanes, an odd row with a tail past the lane blocks,
// and a long odd row. The mixes are many (51), so they run on these few
// shapes, not on every shape of Shapes.
var mixShapes = [][2]int{{2, 1}, {65, 31}, {7, 257}, {3, 4097}}

// dtypeMixes runs every mix of Mixes on mixShapes: each output against the
// oracle (CompareRounded), and each mix with half outputs against the same
// inputs with F32 outputs: bit for bit the F32 outputs rounded once
// (CheckRoundedOnce), and r the same bits.
func (s *suite) dtypeMixes(t *testing.T) {
	b := s.open(t)
	ctx := context.Background()
	for si, sh := range mixShapes {
		base := NewJob(uint64(500+si), sh[0], sh[1])
		for _, m := range Mixes() {
			t.Run(fmt.Sprintf("%dx%d/%s", sh[0], sh[1], m), func(t *testing.T) {
				j := base.WithMix(m)
				o, err := RunJob(ctx, b, j)
				if err != nil {
					t.Fatal(err)
				}
				if err := j.Check(o); err != nil {
					t.Fatal(err)
				}
				if m.DX == compute.F32 && m.DW == compute.F32 {
					return
				}
				f := j
				f.Mix.DX, f.Mix.DW = compute.F32, compute.F32
				ref, err := RunJob(ctx, b, f)
				if err != nil {
					t.Fatal(err)
				}
				if err := CheckRoundedOnce(ref, o, m); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// mixedDTypeJobs returns one job per mix of Mixes on the shapes given,
// deterministic in seed.
func mixedDTypeJobs(seed uint64, shapes [][2]int) []Job {
	var jobs []Job
	for i, m := range Mixes() {
		sh := shapes[i%len(shapes)]
		jobs = append(jobs, NewJob(seed*1000+uint64(i), sh[0], sh[1]).WithMix(m))
	}
	return jobs
}

// dtypeBatching: one job of every mix in ONE command buffer gives bitwise
// what each job gives alone, in every recording order; so does a job of
// each mix under GOMAXPROCS 1 and 2 with enough rows to split into blocks.
func (s *suite) dtypeBatching(t *testing.T) {
	b := s.open(t)
	ctx := context.Background()
	jobs := mixedDTypeJobs(13, [][2]int{{7, 257}, {33, 64}, {1, 1}, {5, 1030}})
	alone := make([]Output, len(jobs))
	for i, j := range jobs {
		o, err := RunJob(ctx, b, j)
		if err != nil {
			t.Fatalf("job %d (%s) alone: %v", i, j.Mix, err)
		}
		alone[i] = o
	}
	for _, order := range []Order{DXThenDW, AllDXThenAllDW, Reversed} {
		outs, err := RunJobs(ctx, b, jobs, order)
		if err != nil {
			t.Fatalf("order %d: %v", order, err)
		}
		for i := range jobs {
			if d := BitsEqual(outs[i], alone[i]); d != "" {
				t.Fatalf("order %d: job %d (%dx%d %s) batched differs from alone: %s", order, i, jobs[i].Rows, jobs[i].Dim, jobs[i].Mix, d)
			}
		}
	}
	rows := 256
	if s.opts.SkipLarge {
		rows = 64
	}
	big := []Job{
		NewJob(71, rows, 1024).WithMix(Mix{X: compute.BF16, W: compute.BF16, DY: compute.BF16, DX: compute.BF16, DW: compute.BF16}),
		NewJob(72, rows/4, 4097).WithMix(Mix{X: compute.F16, W: compute.F32, DY: compute.BF16, DX: compute.F16, DW: compute.F32}),
		NewJob(73, rows, 1024).WithMix(Mix{X: compute.BF16, W: compute.F32, DY: compute.BF16, DX: compute.F32, DW: compute.F32}),
	}
	ref, err := RunJobs(ctx, b, big, DXThenDW)
	if err != nil {
		t.Fatal(err)
	}
	for i, j := range big {
		if err := j.Check(ref[i]); err != nil {
			t.Fatalf("%s: %v", j.Mix, err)
		}
	}
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	for _, procs := range []int{1, 2, prev} {
		runtime.GOMAXPROCS(procs)
		got, err := RunJobs(ctx, b, big, Reversed)
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if d := BitsEqual(got[i], ref[i]); d != "" {
				t.Fatalf("GOMAXPROCS=%d job %d (%s): %s", procs, i, big[i].Mix, d)
			}
		}
	}
}
