package s3_test

import (
	"context"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/storetest"
)

// BenchmarkFreshGoroutine runs a small job's storage calls (Head+Fetch of
// a 32 KiB tensor, Write of a 32 KiB output) each on a new goroutine, as
// the worker does (the queue's goroutine, the handler's): a new
// goroutine's stack starts small, so large frames on these paths show up
// as runtime.morestack/copystack in a -cpuprofile.
func BenchmarkFreshGoroutine(b *testing.B) {
	ctx := context.Background()
	gw := benchGateway(b)
	r := newRouter(newStore(b, gw, nil))
	x := storage.OutTensor{Name: "x", DType: "F32", Shape: []int{8, 1024}, Data: storetest.Pattern(1, 8*1024*4)}
	uri := "s3://data/t/fresh-32KiB.safetensors"
	if _, err := r.Write(ctx, uri, []storage.OutTensor{x}, nil); err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, len(x.Data))
	onFresh := func(b *testing.B, f func() error) {
		b.SetBytes(int64(len(x.Data)))
		b.ReportAllocs()
		errs := make(chan error)
		for b.Loop() {
			go func() { errs <- f() }()
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(stackPerGoroutine(b, f), "stack-B/goroutine")
	}
	b.Run("op=head-fetch/size=32KiB", func(b *testing.B) {
		onFresh(b, func() error {
			ti, err := r.Head(ctx, uri+"#x")
			if err != nil {
				return err
			}
			return r.Fetch(ctx, ti, dst)
		})
	})
	b.Run("op=write/size=32KiB", func(b *testing.B) {
		onFresh(b, func() error {
			_, err := r.Write(ctx, "s3://data/t/fresh-out-32KiB.safetensors", []storage.OutTensor{x}, nil)
			return err
		})
	})
}

// stackPerGoroutine is the stack a fresh goroutine holds after running f
// once: goroutines run f one after another and stay parked, with the GC
// (which shrinks stacks) off, and the growth of StackInuse is divided
// among them. Each doubling past the 2 KiB start is one stack copy.
func stackPerGoroutine(b *testing.B, f func() error) float64 {
	const n = 64
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	done, release := make(chan error), make(chan struct{})
	for range n {
		go func() {
			done <- f()
			<-release
		}()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	close(release)
	return float64(after.StackInuse-before.StackInuse) / n
}
