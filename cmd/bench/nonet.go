package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
)

// memObjects is an in-memory storage.Store that also answers prefix reads
// as storage/s3 does: the worker's storage path without a network, for
// BenchmarkHandlerNoNetwork. Outputs are drained and counted, not kept.
type memObjects struct {
	mu   sync.RWMutex
	objs map[string]memObject
	seq  atomic.Int64
	out  atomic.Int64 // output bytes drained
}

type memObject struct {
	data []byte
	etag string
}

func (m *memObjects) Check(storage.Ref, bool) error { return nil }

func (m *memObjects) get(ref storage.Ref) (memObject, error) {
	m.mu.RLock()
	o, ok := m.objs[ref.Key]
	m.mu.RUnlock()
	if !ok {
		return o, fmt.Errorf("%s: %w", ref, storage.ErrNotFound)
	}
	return o, nil
}

func (m *memObjects) Stat(_ context.Context, ref storage.Ref) (storage.ObjectInfo, error) {
	o, err := m.get(ref)
	return storage.ObjectInfo{Size: int64(len(o.data)), ETag: o.etag}, err
}

func (m *memObjects) ReadAt(_ context.Context, ref storage.Ref, etag string, p []byte, off int64) error {
	o, err := m.get(ref)
	if err != nil {
		return err
	}
	if etag != "" && etag != o.etag {
		return storage.ErrChanged
	}
	if off+int64(len(p)) > int64(len(o.data)) {
		return storage.ErrShortRead
	}
	copy(p, o.data[off:])
	return nil
}

func (m *memObjects) ReadPrefix(_ context.Context, ref storage.Ref, p []byte) (int, storage.ObjectInfo, error) {
	o, err := m.get(ref)
	if err != nil {
		return 0, storage.ObjectInfo{}, err
	}
	return copy(p, o.data), storage.ObjectInfo{Size: int64(len(o.data)), ETag: o.etag}, nil
}

func (m *memObjects) Put(_ context.Context, ref storage.Ref, r io.Reader, size int64) error {
	if strings.HasPrefix(ref.Key, "out/") {
		n, err := io.Copy(io.Discard, r)
		m.out.Add(n)
		if err == nil && n != size {
			err = fmt.Errorf("put %s: %d bytes, want %d", ref, n, size)
		}
		return err
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	m.mu.Lock()
	m.objs[ref.Key] = memObject{data: b, etag: strconv.FormatInt(m.seq.Add(1), 10)}
	m.mu.Unlock()
	return nil
}

// noNetRig is the worker's exact wiring (jobs.Handler, jobs.Batcher with
// its defaults, compute/cpu, storage.Router, Prometheus metrics, JSON logs
// at info to io.Discard) over memObjects: the worker's path per job with
// neither network nor asynq, for the per-job overhead's stable part
// (benchNoNetwork, BenchmarkHandlerNoNetwork). Small (8x1024) jobs; each
// reads its own x and dy (noNetDistinct objects, more than the header
// cache holds, as in a real run every job's are new) and a shared w.
type noNetRig struct {
	mem      *memObjects
	be       *cpu.Backend
	bat      *jobs.Batcher
	h        *jobs.Handler
	payloads [][]byte
	next     atomic.Int64
}

const noNetDistinct = 256

func newNoNetRig(ctx context.Context) (*noNetRig, error) {
	r := &noNetRig{mem: &memObjects{objs: map[string]memObject{}}}
	router := storage.NewRouter()
	router.Register("s3", r.mem)
	rs := newRouterStoreOf(router)
	const rows, dim = 8, 1024
	w := make([]float32, dim)
	fill(w, 2)
	if err := putTensor(ctx, rs, "s3://b/in/w.safetensors", []int{dim}, w); err != nil {
		return nil, err
	}
	x := make([]float32, rows*dim)
	for i := range noNetDistinct {
		for k, name := range []string{"x", "dy"} {
			fill(x, i%7+1+10*k)
			if err := putTensor(ctx, rs, fmt.Sprintf("s3://b/in/%s-%d.safetensors", name, i), []int{rows, dim}, x); err != nil {
				return nil, err
			}
		}
		j := jobs.Job{V: jobs.Version, X: fmt.Sprintf("s3://b/in/x-%d.safetensors", i), W: "s3://b/in/w.safetensors",
			DY: fmt.Sprintf("s3://b/in/dy-%d.safetensors", i), Out: fmt.Sprintf("s3://b/out/%d.safetensors", i),
			Eps: 1e-6, EnqueuedNS: time.Now().UnixNano()}
		p, err := j.Payload()
		if err != nil {
			return nil, err
		}
		r.payloads = append(r.payloads, p)
	}
	r.be = cpu.New()
	log := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})).With("worker", "bench")
	metrics := jobs.NewMetrics(prometheus.NewRegistry())
	r.bat = jobs.NewBatcher(r.be, jobs.BatchConfig{}, metrics, log)
	h, err := jobs.NewHandler(jobs.HandlerConfig{Backend: r.be, Batcher: r.bat, Store: rs,
		Budget: jobs.NewBudget(2 << 30), Worker: "bench", Metrics: metrics, Logger: log})
	if err != nil {
		r.close(ctx)
		return nil, err
	}
	r.h = h
	return r, nil
}

// one runs the next job, as asynq would call the handler.
func (r *noNetRig) one(ctx context.Context) error {
	i := int(r.next.Add(1)) % len(r.payloads)
	return r.h.ProcessTask(ctx, asynq.NewTask(jobs.TaskType, r.payloads[i]))
}

// run runs n jobs on concurrency goroutines.
func (r *noNetRig) run(ctx context.Context, n, concurrency int) error {
	var left atomic.Int64
	left.Store(int64(n))
	errs := make(chan error, concurrency)
	for range concurrency {
		go func() {
			for left.Add(-1) >= 0 {
				if err := r.one(ctx); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range concurrency {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (r *noNetRig) close(ctx context.Context) {
	if r.bat != nil {
		_ = r.bat.Close(ctx)
	}
	r.be.Close()
}

// noNetResult is benchNoNetwork's measurement.
type noNetResult struct {
	CPUPerJob time.Duration // process user+sys CPU per job
	Allocs    float64       // heap allocations per job
	Split     map[string]float64
}

// noNetCategory sorts the no-network run's samples: the outputs'
// sha256, the compute, the in-memory store (a stand-in for the network;
// not the worker's cost), and everything else: the worker's own path and
// the Go runtime under it.
func noNetCategory(stack []string) string {
	for _, f := range stack {
		if strings.HasPrefix(f, "crypto/sha256.") || strings.HasPrefix(f, "crypto/internal/fips140/sha256.") ||
			strings.HasPrefix(f, "github.com/rmsgrad/rmsgrad/internal/sha256x2.") {
			return "sha256"
		}
		if strings.HasPrefix(f, "main.(*memObjects)") {
			return "store"
		}
	}
	if classify(stack) == "compute" {
		return "compute"
	}
	return "path"
}

// benchNoNetwork runs n small jobs through noNetRig on concurrency
// goroutines under pprof (written to profPath) and splits the CPU.
func benchNoNetwork(ctx context.Context, n, concurrency int, profPath string) (noNetResult, error) {
	res := noNetResult{Split: map[string]float64{}}
	rig, err := newNoNetRig(ctx)
	if err != nil {
		return res, err
	}
	defer rig.close(ctx)
	if err := rig.run(ctx, 2*noNetDistinct, concurrency); err != nil { // warm the pools
		return res, err
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0 := cpuTime()
	stop, err := startCPUProfile(profPath)
	if err != nil {
		return res, err
	}
	err = rig.run(ctx, n, concurrency)
	stop()
	res.CPUPerJob = (cpuTime() - cpu0) / time.Duration(n)
	runtime.ReadMemStats(&ms1)
	res.Allocs = float64(ms1.Mallocs-ms0.Mallocs) / float64(n)
	if err != nil {
		return res, fmt.Errorf("no-network run: %w", err)
	}
	samples, err := readProfile(profPath)
	if err != nil {
		return res, err
	}
	for _, s := range samples {
		res.Split[noNetCategory(s.stack)] += float64(s.ns) / 1e3 / float64(n)
	}
	return res, nil
}

// noNetRow is the table's row for r.
func noNetRow(r noNetResult) row {
	sp := r.Split
	return row{Section: "e2e", What: "small: the worker's path without network or asynq (in-memory store, 64 goroutines; pprof split)",
		Figure: fmt.Sprintf("%.0f us CPU/job, %.0f allocs/job; sampled: own path %.0f + outputs' sha256 %.0f + compute %.0f + in-memory store %.0f us",
			float64(r.CPUPerJob.Nanoseconds())/1e3, r.Allocs, sp["path"], sp["sha256"], sp["compute"], sp["store"]),
		Ceiling: "(the overhead row's stable part)"}
}
