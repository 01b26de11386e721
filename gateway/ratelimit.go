package gateway

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiters is a token bucket per token name: each API request takes one
// token. A gateway's buckets are its own, so N gateways behind a load
// balancer allow N times the rate.
type limiters struct {
	rate  rate.Limit
	burst int
	mu    sync.Mutex
	m     map[string]*rate.Limiter
}

// newLimiters returns buckets refilled at perS a second, holding up to
// burst; perS <= 0 means no limit (nil).
func newLimiters(perS float64, burst int) *limiters {
	if perS <= 0 {
		return nil
	}
	return &limiters{rate: rate.Limit(perS), burst: max(burst, 1), m: map[string]*rate.Limiter{}}
}

// allow takes a token from name's bucket, or returns how long until one is
// there.
func (l *limiters) allow(name string) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	l.mu.Lock()
	lim := l.m[name]
	if lim == nil {
		lim = rate.NewLimiter(l.rate, l.burst)
		l.m[name] = lim
	}
	l.mu.Unlock()
	now := time.Now()
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// retryAfter is d in whole seconds, at least 1, for a Retry-After header.
func retryAfter(d time.Duration) int { return max(1, int(math.Ceil(d.Seconds()))) }
