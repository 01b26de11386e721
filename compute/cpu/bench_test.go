package cpu

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// benchShapes are the (rows, dim) shapes.
var benchShapes = [][2]int{{8, 1024}, {64, 4096}, {1024, 4096}, {4096, 4096}, {8192, 4096}}

// job holds one job's buffers for benchmarks.
type benchJob struct {
	x, w, dy, r, dx, dw compute.Buffer
	rows, dim           int
}

func newBenchJob(b testing.TB, be compute.Backend, seed uint64, rows, dim int) *benchJob {
	return newBenchJobMix(b, be, seed, rows, dim, computetest.Mix{})
}

// newBenchJobMix is newBenchJob with the tensors of mix m.
func newBenchJobMix(b testing.TB, be compute.Backend, seed uint64, rows, dim int, m computetest.Mix) *benchJob {
	m = m.Norm()
	j := computetest.NewJob(seed, rows, dim).WithMix(m)
	bj := &benchJob{rows: rows, dim: dim}
	for _, p := range []struct {
		dst   *compute.Buffer
		dt    compute.DType
		src   []float32
		shape []int
	}{{&bj.x, m.X, j.X, []int{rows, dim}}, {&bj.w, m.W, j.W, []int{dim}}, {&bj.dy, m.DY, j.DY, []int{rows, dim}},
		{&bj.r, compute.F32, nil, []int{rows}}, {&bj.dx, m.DX, nil, []int{rows, dim}}, {&bj.dw, m.DW, nil, []int{dim}}} {
		buf, err := be.Alloc(p.dt, p.shape...)
		if err != nil {
			b.Fatal(err)
		}
		if p.src != nil {
			p.dt.Encode(buf.Bytes(), p.src)
		}
		*p.dst = buf
	}
	return bj
}

// bf16 is the all-BF16 mix (outputs like the inputs).
var bf16 = computetest.Mix{X: compute.BF16, W: compute.BF16, DY: compute.BF16, DX: compute.BF16, DW: compute.BF16}

// trafficBytes is a job's minimal traffic per element: read x and dy,
// write dx (12 bytes in F32, 6 in BF16).
func trafficBytes(m computetest.Mix) int {
	m = m.Norm()
	return m.X.Size() + m.DY.Size() + m.DX.Size()
}

// recordAll records every job the way a worker batch does: every RMSInv,
// one barrier, every DX and DW.
func recordAll(b testing.TB, cb *compute.CommandBuffer, jobs []*benchJob) {
	for _, j := range jobs {
		if err := cb.RMSInv(j.x, j.r, compute.RMSInvParams(1e-5, j.dim), j.rows, j.dim); err != nil {
			b.Fatal(err)
		}
	}
	cb.Barrier()
	for _, j := range jobs {
		if err := cb.DX(j.x, j.w, j.dy, j.r, j.dx, compute.DXParams(j.dim, 1e-5), j.rows, j.dim); err != nil {
			b.Fatal(err)
		}
		if err := cb.DW(j.x, j.dy, j.r, j.dw, compute.DWParams(j.dim, j.rows), j.rows, j.dim); err != nil {
			b.Fatal(err)
		}
	}
}

func commit(b *testing.B, cb *compute.CommandBuffer) {
	if _, err := cb.Commit(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBackward is the whole backward (RMSInv, barrier, DX, DW) of one
// job, all F32 or (the -bf16 variants) all BF16. SetBytes counts the
// minimal traffic, 12 bytes per element in F32 and 6 in BF16 (read x and
// dy, write dx), so MB/s compares with BenchmarkCopy directly.
func BenchmarkBackward(b *testing.B) {
	for _, variant := range []struct {
		name string
		be   *Backend
		mix  computetest.Mix
	}{{"best", New(), computetest.Mix{}}, {"scalar", New(Scalar()), computetest.Mix{}},
		{"best-bf16", New(), bf16}, {"scalar-bf16", New(Scalar()), bf16}} {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%dx%d", variant.name, s[0], s[1]), func(b *testing.B) {
				j := newBenchJobMix(b, variant.be, 1, s[0], s[1], variant.mix)
				cb := compute.NewCommandBuffer(variant.be)
				b.SetBytes(int64(trafficBytes(variant.mix) * s[0] * s[1]))
				b.ResetTimer()
				for range b.N {
					cb.Reset()
					recordAll(b, cb, []*benchJob{j})
					commit(b, cb)
				}
			})
		}
	}
}

// BenchmarkCopy is the ceiling: copy() of the same 12*rows*dim bytes the
// backward is credited with, from and to buffers of that size; "serial" is
// one copy() call, "parallel" splits it over GOMAXPROCS goroutines, as the
// backend splits its work (the fairer ceiling for a multi-core backend).
func BenchmarkCopy(b *testing.B) {
	for _, s := range benchShapes {
		for _, par := range []bool{false, true} {
			name := "serial"
			if par {
				name = "parallel"
			}
			b.Run(fmt.Sprintf("%s/%dx%d", name, s[0], s[1]), func(b *testing.B) {
				benchCopy(b, 12*s[0]*s[1], par)
			})
		}
	}
}

func benchCopy(b *testing.B, n int, parallel bool) {
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in before timing
	workers := 1
	if parallel {
		workers = runtime.GOMAXPROCS(0)
	}
	chunk := (n/workers + 63) &^ 63
	b.SetBytes(int64(n))
	b.ResetTimer()
	for range b.N {
		if workers == 1 {
			copy(dst, src)
			continue
		}
		var wg sync.WaitGroup
		for lo := 0; lo < n; lo += chunk {
			hi := min(n, lo+chunk)
			wg.Add(1)
			go func() {
				defer wg.Done()
				copy(dst[lo:hi], src[lo:hi])
			}()
		}
		wg.Wait()
	}
}

// BenchmarkBatch256 runs 256 jobs of 8x1024 in one command buffer versus
// one command buffer each, reporting jobs/s.
func BenchmarkBatch256(b *testing.B) {
	be := New()
	jobs := make([]*benchJob, 256)
	for i := range jobs {
		jobs[i] = newBenchJob(b, be, uint64(i), 8, 1024)
	}
	b.Run("one-buffer", func(b *testing.B) {
		cb := compute.NewCommandBuffer(be)
		b.SetBytes(int64(12 * 8 * 1024 * len(jobs)))
		for range b.N {
			cb.Reset()
			recordAll(b, cb, jobs)
			commit(b, cb)
		}
		b.ReportMetric(float64(b.N*len(jobs))/b.Elapsed().Seconds(), "jobs/s")
	})
	b.Run("buffer-each", func(b *testing.B) {
		cb := compute.NewCommandBuffer(be)
		b.SetBytes(int64(12 * 8 * 1024 * len(jobs)))
		for range b.N {
			for _, j := range jobs {
				cb.Reset()
				recordAll(b, cb, []*benchJob{j})
				commit(b, cb)
			}
		}
		b.ReportMetric(float64(b.N*len(jobs))/b.Elapsed().Seconds(), "jobs/s")
	})
}

// BenchmarkRatio alternates one backward and one copy() of the same bytes
// (the job's minimal traffic: 12*rows*dim in F32, 6*rows*dim in BF16) in
// every iteration and reports their throughput ratio (ours/copy, 1 =
// copy's rate). Interleaving makes the ratio robust to the load of a
// shared machine, which shifts separate benchmarks by 2x. The bf16 rows
// run every tensor in BF16.
func BenchmarkRatio(b *testing.B) {
	be := New()
	for _, dt := range []struct {
		name string
		mix  computetest.Mix
	}{{"f32", computetest.Mix{}}, {"bf16", bf16}} {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%dx%d", dt.name, s[0], s[1]), func(b *testing.B) {
				j := newBenchJobMix(b, be, 1, s[0], s[1], dt.mix)
				cb := compute.NewCommandBuffer(be)
				n := trafficBytes(dt.mix) * s[0] * s[1]
				src, dst := make([]byte, n), make([]byte, n)
				for i := range src {
					src[i] = byte(i)
				}
				copy(dst, src)
				var ours, cp time.Duration
				b.SetBytes(int64(n))
				b.ResetTimer()
				for range b.N {
					t0 := time.Now()
					cb.Reset()
					recordAll(b, cb, []*benchJob{j})
					commit(b, cb)
					t1 := time.Now()
					copy(dst, src)
					cp += time.Since(t1)
					ours += t1.Sub(t0)
				}
				b.ReportMetric(float64(cp)/float64(ours), "ours/copy")
			})
		}
	}
}
