package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/cuda"
	"github.com/rmsgrad/rmsgrad/metal"
	"github.com/rmsgrad/rmsgrad/shaders/mslcpu"
)

// computeResult is one backend (or the memory copy) on one job class.
type computeResult struct {
	Backend  string // "memcopy", "msl-cpu", "cpu", ...
	Device   string
	Shape    shape
	Jobs     int
	JobsPerS float64
	GBs      float64 // tensor bytes (x, w, dy in; dx, dw out) per second
	Missing  string  // why the backend was not measured; "" when it was
}

// opener opens one backend for the compute-only measurement, or says why it
// is not present on this machine.
type opener struct {
	name string
	open func(ctx context.Context, dir string) (compute.Backend, error)
	// maxJobs caps the jobs per shape for a backend that exists to check
	// the shader rather than to be fast (msl-cpu pipes every buffer through
	// a child process); 0 means no cap, -1 skips the shape (msl-cpu takes
	// about a minute per large job).
	maxJobs map[string]int
}

// backendOpeners lists every backend rmsgrad knows. A backend whose package
// is not in this tree (or not built for this OS) reports why, so the table
// always shows the whole list.
var backendOpeners = []opener{
	{name: "cpu", open: func(context.Context, string) (compute.Backend, error) { return cpu.Open() }},
	{name: mslcpu.Name, open: func(ctx context.Context, dir string) (compute.Backend, error) {
		d := filepath.Join(dir, "mslcpu")
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		driver, err := mslcpu.Build(ctx, mslcpu.BuildOptions{Dir: d})
		if err != nil {
			return nil, fmt.Errorf("not present: build the msl-cpu driver (needs g++): %w", err)
		}
		return mslcpu.Open(mslcpu.Options{Driver: driver})
	}, maxJobs: map[string]int{"small": 20, "medium": 5, "large": -1}},
	{name: "metal", open: func(context.Context, string) (compute.Backend, error) {
		be, err := metal.Open()
		if err != nil {
			return nil, fmt.Errorf("not present: %w", err)
		}
		return be, nil
	}},
	{name: "cuda", open: func(context.Context, string) (compute.Backend, error) {
		be, err := cuda.Open()
		if err != nil {
			return nil, fmt.Errorf("not present: %w", err)
		}
		return be, nil
	}},
}

// fill writes a deterministic, non-trivial pattern (values in [-1, 1)).
func fill(f []float32, seed int) {
	for i := range f {
		f[i] = float32((i*7919+seed*104729)%2000-1000) / 1000
	}
}

// benchMemcopy copies each job's input bytes into output buffers of the same
// size: x -> dx, dy -> a scratch buffer, w -> dw, and reports the memory
// traffic (bytes read plus bytes written) per second: the streaming
// bandwidth a backend that reads x, w, dy once and writes dx, dw once
// could at best reach. Jobs are spread
// over GOMAXPROCS goroutines, as a backend spreads its work over all CPUs.
func benchMemcopy(s shape, n int) computeResult {
	procs := min(runtime.GOMAXPROCS(0), n)
	per := (n + procs - 1) / procs
	var ready, wg sync.WaitGroup
	start := make(chan struct{})
	for p := 0; p < procs; p++ {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			x, dy := make([]byte, s.XBytes()), make([]byte, s.XBytes())
			w := make([]byte, s.Dim*4)
			dx, scratch, dw := make([]byte, len(x)), make([]byte, len(x)), make([]byte, len(w))
			// Touch every page first: the worker's buffers come from a warm
			// pool, so page faults are not part of the ceiling.
			for _, b := range [][]byte{x, dy, w} {
				for i := range b {
					b[i] = byte(i)
				}
			}
			copy(dx, x)
			copy(scratch, dy)
			copy(dw, w)
			ready.Done()
			<-start
			for i := 0; i < per; i++ {
				copy(dx, x)
				copy(scratch, dy)
				copy(dw, w)
			}
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	wg.Wait()
	el := time.Since(t0).Seconds()
	done := per * procs
	r := computeResult{Backend: "memcopy", Device: fmt.Sprintf("Go copy on %d goroutines", procs), Shape: s, Jobs: done}
	// A copy reads and writes every byte it moves: count both, so the
	// figure is memory traffic per second, comparable with a backend's
	// tensor bytes (each read or written once) per second.
	r.GBs = float64(done) * 2 * float64(2*s.XBytes()+s.Dim*4) / el / 1e9
	// Jobs/s the copy's bandwidth would allow a job of this shape.
	r.JobsPerS = r.GBs * 1e9 / float64(s.TensorBytes())
	return r
}

// benchBackend runs n jobs of shape s on b, one command buffer per job with
// the worker's op order (rms_inv, barrier, dx, dw), reusing the buffers as
// the worker's pool does.
func benchBackend(ctx context.Context, b compute.Backend, s shape, n int) (computeResult, error) {
	r := computeResult{Backend: b.Name(), Device: b.DeviceName(), Shape: s, Jobs: n}
	var bufs []compute.Buffer
	defer func() {
		for _, x := range bufs {
			x.Release()
		}
	}()
	// x, w, dy, r, dx, dw in that order.
	for _, sh := range [][]int{{s.Rows, s.Dim}, {s.Dim}, {s.Rows, s.Dim}, {s.Rows}, {s.Rows, s.Dim}, {s.Dim}} {
		buf, err := b.Alloc(compute.F32, sh...)
		if err != nil {
			return r, fmt.Errorf("compute %s %s: alloc %v: %w", b.Name(), s.Name, sh, err)
		}
		bufs = append(bufs, buf)
	}
	x, w, dy, rr, dx, dw := bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5]
	fill(x.Float32s(), 1)
	fill(w.Float32s(), 2)
	fill(dy.Float32s(), 3)
	cb := compute.NewCommandBuffer(b)
	var t0 time.Time
	// Iteration 0 warms the pool and the pages and is not timed.
	for i := 0; i <= n; i++ {
		if i == 1 {
			t0 = time.Now()
		}
		cb.Reset()
		if err := cb.RMSInv(x, rr, compute.RMSInvParams(1e-6, s.Dim), s.Rows, s.Dim); err != nil {
			return r, fmt.Errorf("compute %s %s: %w", b.Name(), s.Name, err)
		}
		cb.Barrier()
		if err := cb.DX(x, w, dy, rr, dx, compute.DXParams(s.Dim, 1e-6), s.Rows, s.Dim); err != nil {
			return r, fmt.Errorf("compute %s %s: %w", b.Name(), s.Name, err)
		}
		if err := cb.DW(x, dy, rr, dw, compute.DWParams(s.Dim, s.Rows), s.Rows, s.Dim); err != nil {
			return r, fmt.Errorf("compute %s %s: %w", b.Name(), s.Name, err)
		}
		if _, err := cb.Commit(ctx); err != nil {
			return r, fmt.Errorf("compute %s %s: commit: %w", b.Name(), s.Name, err)
		}
	}
	el := time.Since(t0).Seconds()
	// A backend that wrote nothing would look fast: check the outputs moved.
	if v := dx.Float32s()[len(dx.Float32s())-1]; v == 0 || math.IsNaN(float64(v)) {
		return r, fmt.Errorf("compute %s %s: dx[last] = %v, the backend did not compute", b.Name(), s.Name, v)
	}
	r.JobsPerS = float64(n) / el
	r.GBs = r.JobsPerS * float64(s.TensorBytes()) / 1e9
	return r, nil
}

// benchCompute measures the memory copy and every backend present on each
// shape, s.Jobs jobs each (the copy runs four times as many: it is fast).
func benchCompute(ctx context.Context, dir string, shapes []shape) ([]computeResult, error) {
	var out []computeResult
	for _, s := range shapes {
		out = append(out, benchMemcopy(s, max(s.Jobs*4, 4)))
	}
	for _, o := range backendOpeners {
		b, err := o.open(ctx, dir)
		if err != nil {
			slog.Info("compute backend not measured", "backend", o.name, "why", err)
			out = append(out, computeResult{Backend: o.name, Missing: err.Error()})
			continue
		}
		for _, s := range shapes {
			n := s.Jobs
			if c := o.maxJobs[s.Name]; c > 0 {
				n = min(n, c)
			} else if c < 0 {
				out = append(out, computeResult{Backend: o.name, Shape: s, Missing: "skipped for " + s.Name + ": too slow to be worth the run time"})
				continue
			}
			r, err := benchBackend(ctx, b, s, n)
			if err != nil {
				_ = b.Close()
				return out, err
			}
			slog.Info("compute", "backend", r.Backend, "shape", s.Name, "jobs_per_s", r.JobsPerS, "gbs", r.GBs)
			out = append(out, r)
		}
		if err := b.Close(); err != nil {
			return out, fmt.Errorf("close %s: %w", o.name, err)
		}
	}
	return out, nil
}
