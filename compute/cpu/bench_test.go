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
	j := computetest.NewJob(seed, rows, dim)
	bj := &benchJob{rows: rows, dim: dim}
	for _, p := range []struct {
		dst   *compute.Buffer
		src   []float32
		shape []int
	}{{&bj.x, j.X, []int{rows, dim}}, {&bj.w, j.W, []int{dim}}, {&bj.dy, j.DY, []int{rows, dim}},
		{&bj.r, nil, []int{rows}}, {&bj.dx, nil, []int{rows, dim}}, {&bj.dw, nil, []int{dim}}} {
		buf, err := be.Alloc(compute.F32, p.shape...)
		if err != nil {
			b.Fatal(err)
		}
		copy(buf.Float32s(), p.src)
		*p.dst = buf
	}
	return bj
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
// job. SetBytes counts the minimal traffic, 12 bytes per element (read x
// and dy, write dx), so MB/s compares with BenchmarkCopy directly.
func BenchmarkBackward(b *testing.B) {
	for _, variant := range []struct {
		name string
		be   *Backend
	}{{"best", New()}, {"scalar", New(Scalar())}} {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%dx%d", variant.name, s[0], s[1]), func(b *testing.B) {
				j := newBenchJob(b, variant.be, 1, s[0], s[1])
				cb := compute.NewCommandBuffer(variant.be)
				b.SetBytes(int64(12 * s[0] * s[1]))
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

// BenchmarkRatio alternates one backward and one copy() of the same
// 12*rows*dim bytes in every iteration and reports their throughput ratio
// (ours/copy, 1 = copy's rate). Interleaving makes the ratio robust to the
// load of a shared machine, which shifts separate benchmarks by 2x.
func BenchmarkRatio(b *testing.B) {
	be := New()
	for _, s := range benchShapes {
		b.Run(fmt.Sprintf("%dx%d", s[0], s[1]), func(b *testing.B) {
			j := newBenchJob(b, be, 1, s[0], s[1])
			cb := compute.NewCommandBuffer(be)
			n := 12 * s[0] * s[1]
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
