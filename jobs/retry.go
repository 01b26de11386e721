package jobs

import (
	"errors"
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"
)

// RetryDelay returns asynq's RetryDelayFunc for transient failures: capped
// exponential backoff (base * 2^n, at most max) with equal jitter (a uniform
// draw in [d/2, d]), so a fleet that failed together (a storage outage) does
// not retry in lockstep. Permanent errors never get here: they wrap
// asynq.SkipRetry.
//
// n is asynq's count of failed attempts, which outages do not raise
// (IsFailure): for a job that met an outage while it ran, the streak of
// outages in a row this worker saw (JobError.OutageStreak) is added, so
// such a job still backs off; one handed back by the readiness gate keeps
// the short delay, the gate itself bounding how often it comes back.
func RetryDelay(base, max time.Duration) asynq.RetryDelayFunc {
	if base <= 0 {
		base = time.Second
	}
	if max < base {
		max = base
	}
	return func(n int, err error, _ *asynq.Task) time.Duration {
		var je *JobError
		if errors.As(err, &je) && je.OutageStreak > 0 {
			n += je.OutageStreak
		}
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
