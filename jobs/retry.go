package jobs

import (
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"
)

// RetryDelay returns asynq's RetryDelayFunc for transient failures: capped
// exponential backoff (base * 2^n, at most max) with equal jitter (a uniform
// draw in [d/2, d]), so a fleet that failed together (a storage outage) does
// not retry in lockstep. Permanent errors never get here: they wrap
// asynq.SkipRetry.
func RetryDelay(base, max time.Duration) asynq.RetryDelayFunc {
	if base <= 0 {
		base = time.Second
	}
	if max < base {
		max = base
	}
	return func(n int, _ error, _ *asynq.Task) time.Duration {
		d := max
		if n < 40 {
			if e := base << uint(n); e > 0 && e < max {
				d = e
			}
		}
		half := d / 2
		return half + rand.N(d-half+1)
	}
}
