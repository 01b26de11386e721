package stackgrow

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPoolOverflow: past max busy goroutines, work still runs (on fresh
// goroutines) and the pool keeps max.
func TestPoolOverflow(t *testing.T) {
	p := NewPool(2)
	release := make(chan struct{})
	var wg sync.WaitGroup
	var ran atomic.Int32
	for range 5 {
		wg.Add(1)
		p.Go(func() {
			defer wg.Done()
			ran.Add(1)
			<-release
		})
	}
	for deadline := time.Now().Add(10 * time.Second); ran.Load() != 5; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 5 functions ran", ran.Load())
		}
	}
	if n := p.Len(); n != 2 {
		t.Errorf("the pool keeps %d goroutines, want max 2", n)
	}
	close(release)
	wg.Wait()
}

// TestPoolReuses: functions run one after another reuse the pool's
// goroutine instead of starting new ones.
func TestPoolReuses(t *testing.T) {
	p := NewPool(8)
	for range 20 {
		done := make(chan struct{})
		p.Go(func() { close(done) })
		<-done
		time.Sleep(2 * time.Millisecond) // the goroutine parks again
	}
	// Without reuse 20 calls would start 8 (max); a loaded machine may
	// not park a goroutine within the pause now and then.
	if n := p.Len(); n > 4 {
		t.Errorf("%d goroutines for 20 calls one after another: they are not reused", n)
	}
}
