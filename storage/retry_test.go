package storage

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errTransient = errors.New("transient")

func isTransient(err error) bool { return errors.Is(err, errTransient) }

// TestRetryBackoffCapped: the sleep limits double from Base and stop at
// Max; op runs Attempts times; the last error is returned.
func TestRetryBackoffCapped(t *testing.T) {
	var limits []time.Duration
	saved := jitter
	t.Cleanup(func() { jitter = saved })
	jitter = func(l time.Duration) time.Duration { limits = append(limits, l); return 0 }
	calls := 0
	err := Retry(context.Background(), Backoff{Attempts: 7, Base: time.Millisecond, Max: 5 * time.Millisecond}, isTransient,
		func(context.Context) error { calls++; return errTransient })
	if !errors.Is(err, errTransient) || calls != 7 {
		t.Fatalf("Retry = %v after %d calls, want the transient error after 7", err, calls)
	}
	want := []time.Duration{1, 2, 4, 5, 5, 5}
	if len(limits) != len(want) {
		t.Fatalf("limits %v, want %v ms", limits, want)
	}
	for i := range want {
		if limits[i] != want[i]*time.Millisecond {
			t.Errorf("limit before attempt %d = %v, want %v", i+2, limits[i], want[i]*time.Millisecond)
		}
	}
	// Huge attempt numbers do not overflow past Max.
	if l := (Backoff{Base: time.Second, Max: time.Minute}).limit(80); l != time.Minute {
		t.Errorf("limit(80) = %v", l)
	}
}

// TestRetryJitter: sleeps are uniform in [0, limit], not a fixed value.
func TestRetryJitter(t *testing.T) {
	const limit = 100 * time.Millisecond
	lo, hi := limit, time.Duration(0)
	for i := 0; i < 2000; i++ {
		d := jitter(limit)
		if d < 0 || d > limit {
			t.Fatalf("jitter(%v) = %v, out of [0, limit]", limit, d)
		}
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo > limit/10 || hi < limit*9/10 {
		t.Errorf("2000 draws span only [%v, %v] of [0, %v]: not full jitter", lo, hi, limit)
	}
}

// TestRetryPermanent: an error retryable rejects is returned at once.
func TestRetryPermanent(t *testing.T) {
	perm := errors.New("permanent")
	calls := 0
	err := Retry(context.Background(), Backoff{Attempts: 5}, isTransient, func(context.Context) error { calls++; return perm })
	if err != perm || calls != 1 {
		t.Errorf("Retry = %v after %d calls, want the permanent error after 1", err, calls)
	}
	calls = 0
	err = Retry(context.Background(), Backoff{Attempts: 5, Base: time.Millisecond}, isTransient, func(context.Context) error {
		if calls++; calls < 3 {
			return errTransient
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("Retry = %v after %d calls, want success on the 3rd", err, calls)
	}
}

// TestRetryContext: cancellation ends the wait between attempts at once,
// and a context already done runs nothing.
func TestRetryContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	time.AfterFunc(50*time.Millisecond, cancel)
	t0 := time.Now()
	err := Retry(ctx, Backoff{Attempts: 10, Base: time.Hour, Max: time.Hour}, isTransient, func(context.Context) error {
		calls++
		return errTransient
	})
	if el := time.Since(t0); el > 5*time.Second {
		t.Errorf("Retry returned %v after the cancel", el)
	}
	if !errors.Is(err, context.Canceled) || !errors.Is(err, errTransient) || calls != 1 {
		t.Errorf("Retry = %v after %d calls, want the op's error joined with context.Canceled after 1", err, calls)
	}
	calls = 0
	if err := Retry(ctx, Backoff{}, isTransient, func(context.Context) error { calls++; return nil }); !errors.Is(err, context.Canceled) || calls != 0 {
		t.Errorf("Retry on a done context = %v, %d calls", err, calls)
	}
}
