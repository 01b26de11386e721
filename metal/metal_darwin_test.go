//go:build cgo

package metal

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// openTest returns the Metal backend, skipping when the machine has no Metal
// device (a CI VM without a GPU); any other failure (the source does not
// compile, a pipeline fails) is a test failure.
func openTest(t *testing.T) compute.Backend {
	t.Helper()
	b, err := Open()
	if err != nil {
		if errors.Is(err, compute.ErrUnsupported) && b == nil && isNoDevice(err) {
			t.Skipf("no Metal device: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func isNoDevice(err error) bool { return strings.HasPrefix(err.Error(), "metal: no Metal device") }

// The whole conformance suite on the GPU, every shape included.
func TestConformance(t *testing.T) {
	computetest.Run(t, openTest)
}

func TestValidation(t *testing.T) {
	computetest.RunValidation(t, openTest)
}

// Buffers are views of the shared MTLBuffer: a write through Float32s is
// seen through Bytes, and a released buffer's memory is reused.
func TestSharedBufferViewsAndPool(t *testing.T) {
	b := openTest(t)
	buf, err := b.Alloc(compute.F32, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	f := buf.Float32s()
	if len(f) != 15 || len(buf.Bytes()) != 60 {
		t.Fatalf("views: %d floats, %d bytes; want 15, 60", len(f), len(buf.Bytes()))
	}
	f[0] = 1
	if buf.Bytes()[3] != 0x3f {
		t.Fatalf("Bytes does not alias Float32s: % x", buf.Bytes()[:4])
	}
	p := &buf.Bytes()[0]
	buf.Release()
	again, err := b.Alloc(compute.F32, 15)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release()
	if &again.Bytes()[0] != p {
		t.Error("a released buffer of the same length was not reused")
	}
}

// With PoolLimit, buffers in use and pooled together stay within the
// limit: released buffers over it go back to the system, and pooled ones
// of other sizes make room for a new one.
func TestPoolLimit(t *testing.T) {
	const limit = 4 << 20
	be, err := Open(PoolLimit(limit))
	if err != nil {
		if errors.Is(err, compute.ErrUnsupported) && isNoDevice(err) {
			t.Skipf("no Metal device: %v", err)
		}
		t.Fatal(err)
	}
	defer be.Close()
	b := be.(*Backend)
	held := func() int64 {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.live + b.pooled
	}
	for _, size := range []int{1 << 18, 1 << 19, 3 << 18, 1 << 17} { // f32 elements: 1, 2, 3, 0.5 MiB
		var bufs []compute.Buffer
		for range 6 {
			buf, err := b.Alloc(compute.F32, size)
			if err != nil {
				t.Fatal(err)
			}
			bufs = append(bufs, buf)
		}
		for _, buf := range bufs {
			buf.Release()
		}
		if h := held(); h > limit {
			t.Fatalf("after releasing 6 buffers of %d bytes: %d bytes held, limit %d", 4*size, h, limit)
		}
	}
}

// Close waits for an Execute in flight, and Execute after Close fails
// cleanly.
func TestCloseDuringExecute(t *testing.T) {
	b := openTest(t)
	j := computetest.NewJob(1, 4096, 1024)
	done := make(chan error, 1)
	go func() {
		_, err := computetest.RunJob(context.Background(), b, j)
		done <- err
	}()
	time.Sleep(time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil && !errors.Is(err, compute.ErrDevice) && !errors.Is(err, compute.ErrUnsupported) {
		t.Fatalf("Execute racing Close: %v, want success or a clean ErrDevice/ErrUnsupported", err)
	}
	if _, err := computetest.RunJob(context.Background(), b, j); err == nil {
		t.Fatal("a job ran after Close")
	}
}

// A plan split over many command buffers (a tiny MaxCommandBytes) gives
// the same bits as one command buffer.
func TestCommandBufferSplit(t *testing.T) {
	whole := openTest(t)
	split, err := Open(MaxCommandBytes(1 << 20))
	if err != nil {
		t.Fatal(err)
	}
	defer split.Close()
	j := computetest.NewJob(3, 3000, 1000)
	a, err := computetest.RunJob(context.Background(), whole, j)
	if err != nil {
		t.Fatal(err)
	}
	c, err := computetest.RunJob(context.Background(), split, j)
	if err != nil {
		t.Fatal(err)
	}
	if !computetest.SameBits(a, c) {
		t.Fatal("outputs differ between one command buffer and a split plan")
	}
}
