package storage

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Backoff is a capped exponential backoff with full jitter: before attempt
// n+1 it sleeps a uniform random time in [0, min(Max, Base*2^n)]. Jitter
// keeps many workers that failed together from retrying together.
type Backoff struct {
	Attempts int           // total tries, first included; <= 0 means 5
	Base     time.Duration // first cap; 0 means 100 ms
	Max      time.Duration // largest cap; 0 means 5 s
}

// DefaultBackoff is what the stores use unless configured otherwise: five
// tries over at most about 10 s, enough to ride out a gateway restart.
var DefaultBackoff = Backoff{Attempts: 5, Base: 100 * time.Millisecond, Max: 5 * time.Second}

// limit is the cap on the sleep after failed attempt n (0-based):
// Base*2^n, at most Max.
func (b Backoff) limit(n int) time.Duration {
	l := b.Base << n
	if l > b.Max || l <= 0 || n >= 62 {
		l = b.Max
	}
	return l
}

// jitter draws the sleep before the next attempt: uniform in [0, limit]
// ("full jitter"). A variable so tests can see the limits.
var jitter = func(limit time.Duration) time.Duration { return rand.N(limit + 1) }

// Retry runs op until it succeeds, fails with an error retryable rejects,
// runs out of attempts, or ctx ends. It returns op's last error (ctx's
// error joined to it when ctx ended while waiting).
func Retry(ctx context.Context, b Backoff, retryable func(error) bool, op func(ctx context.Context) error) error {
	if b.Attempts <= 0 {
		b.Attempts = 5
	}
	if b.Base <= 0 {
		b.Base = 100 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 5 * time.Second
	}
	var err error
	for n := 0; n < b.Attempts; n++ {
		if err = ctx.Err(); err != nil {
			return err
		}
		if err = op(ctx); err == nil || !retryable(err) || n == b.Attempts-1 {
			return err
		}
		t := time.NewTimer(jitter(b.limit(n)))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
	return err
}
