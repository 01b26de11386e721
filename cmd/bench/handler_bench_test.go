package main

import (
	"context"
	"runtime"
	"testing"
)

// BenchmarkHandlerNoNetwork runs small jobs through noNetRig (the
// worker's exact wiring over an in-memory store: no Redis, no HTTP) on 64
// concurrent goroutines, as asynq's 64 workers would call the handler.
// cpu-us/job is the process's user+sys CPU per job: the worker's own path,
// the outputs' sha256, the compute and the Go runtime under them. It is
// the steady A/B figure for the per-job overhead, which cmd/bench's pprof
// split of a real run measures only to +-30 us on a shared machine.
func BenchmarkHandlerNoNetwork(b *testing.B) {
	benchNoNet(b, func(ctx context.Context, rig *noNetRig) error { return rig.one(ctx) })
}

// BenchmarkHandlerNoNetworkFresh is BenchmarkHandlerNoNetwork with every
// job's handler called on a goroutine of its own that ends with the job,
// as asynq's processor does: it counts what a fresh goroutine costs the
// job's path (its stack growths, the stack's allocation and release).
func BenchmarkHandlerNoNetworkFresh(b *testing.B) {
	benchNoNet(b, func(ctx context.Context, rig *noNetRig) error {
		errc := make(chan error, 1)
		go func() { errc <- rig.one(ctx) }()
		return <-errc
	})
}

// benchNoNet runs job (one small job through rig) on 64 goroutines and
// reports the process's CPU per job.
func benchNoNet(b *testing.B, job func(context.Context, *noNetRig) error) {
	ctx := context.Background()
	rig, err := newNoNetRig(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer rig.close(ctx)
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := job(ctx, rig); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/job")
	if rig.mem.out.Load() == 0 {
		b.Fatal("no output written")
	}
}
