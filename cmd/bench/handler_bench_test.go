package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
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
	if bytes.HasPrefix([]byte(ref.Key), []byte("out/")) {
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

// BenchmarkHandlerNoNetwork runs small (8x1024) jobs through the worker's
// exact wiring (jobs.Handler, jobs.Batcher with its defaults, compute/cpu,
// storage.Router, Prometheus metrics, JSON logs at info to io.Discard) on
// 64 concurrent goroutines, as asynq's 64 workers would call it, against an
// in-memory store: no Redis, no HTTP. Each job reads its own x and dy (256
// distinct objects, more than the header cache holds) and the shared w.
// cpu-us/job is the process's user+sys CPU per job: rmsgrad's own code,
// the compute and the Go runtime under it, with neither network nor asynq.
// It is the precise A/B tool for the per-job overhead that cmd/bench's
// pprof split measures noisily.
func BenchmarkHandlerNoNetwork(b *testing.B) {
	ctx := context.Background()
	mem := &memObjects{objs: map[string]memObject{}}
	r := storage.NewRouter()
	r.Register("s3", mem)
	rs := routerStore{r: r}
	const rows, dim, distinct = 8, 1024, 256
	w := make([]float32, dim)
	fill(w, 2)
	if err := putTensor(ctx, rs, "s3://b/in/w.safetensors", []int{dim}, w); err != nil {
		b.Fatal(err)
	}
	x := make([]float32, rows*dim)
	payloads := make([][]byte, distinct)
	for i := range distinct {
		for k, name := range []string{"x", "dy"} {
			fill(x, i%7+1+10*k)
			if err := putTensor(ctx, rs, fmt.Sprintf("s3://b/in/%s-%d.safetensors", name, i), []int{rows, dim}, x); err != nil {
				b.Fatal(err)
			}
		}
		j := jobs.Job{V: jobs.Version, X: fmt.Sprintf("s3://b/in/x-%d.safetensors", i), W: "s3://b/in/w.safetensors",
			DY: fmt.Sprintf("s3://b/in/dy-%d.safetensors", i), Out: fmt.Sprintf("s3://b/out/%d.safetensors", i),
			Eps: 1e-6, EnqueuedNS: time.Now().UnixNano()}
		p, err := j.Payload()
		if err != nil {
			b.Fatal(err)
		}
		payloads[i] = p
	}
	be := cpu.New()
	defer be.Close()
	log := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})).With("worker", "bench")
	metrics := jobs.NewMetrics(prometheus.NewRegistry())
	bat := jobs.NewBatcher(be, jobs.BatchConfig{}, metrics, log)
	defer bat.Close(ctx)
	h, err := jobs.NewHandler(jobs.HandlerConfig{Backend: be, Batcher: bat, Store: rs,
		Budget: jobs.NewBudget(2 << 30), Worker: "bench", Metrics: metrics, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1)) % distinct
			if err := h.ProcessTask(ctx, asynq.NewTask(jobs.TaskType, payloads[i])); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/job")
	if mem.out.Load() == 0 {
		b.Fatal("no output written")
	}
}
