package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rmsgrad/rmsgrad/storage"
)

// ErrNotReady is wrapped by the error of a job that the worker's readiness
// gate held while a dependency was down and then handed back to the queue
// (or let go because the worker is shutting down): the job did nothing, so
// it is not a failure (IsFailure).
var ErrNotReady = errors.New("worker not ready")

// ErrResultUnavailable is wrapped when a finished job could not record its
// result because Redis did not answer: a dependency outage, not the job's
// fault.
var ErrResultUnavailable = errors.New("result not recorded: redis unavailable")

// IsOutage reports whether err comes from a dependency being down rather
// than from the job: storage unavailable after the store's own retries (5xx,
// 429, timeouts, refused or reset connections), a job held at the readiness
// gate, or a result Redis would not take. Permanent errors are never
// outages.
func IsOutage(err error) bool {
	if err == nil || IsPermanent(err) {
		return false
	}
	return errors.Is(err, ErrNotReady) || errors.Is(err, storage.ErrUnavailable) || errors.Is(err, ErrResultUnavailable)
}

// IsFailure is asynq's Config.IsFailure for the worker: an outage
// (IsOutage) is not a failure, so asynq retries the job without counting
// the attempt against its max_retry (asynq v0.26.0: the retried counter is
// incremented only when IsFailure says true, and a task is archived only
// once that counter reaches max_retry). Everything else is: job-level
// trouble (an object that ends early or changes under the read, a
// deadline, a panic, a worker killed under the job, which asynq's
// recoverer reports as a lease that expired) keeps using up the job's
// retries, so a job that can never succeed still ends in the archive.
func IsFailure(err error) bool { return err != nil && !IsOutage(err) }

// defaultGateHold is how long the gate holds one job by default.
const defaultGateHold = 30 * time.Second

// Gate holds jobs at the start of the handler while a dependency of the
// worker is down (the worker's readiness probe sets it), so an outage of
// any length neither runs jobs into errors nor uses up their retries.
//
// asynq has no pause on its Server (Stop is final: the processor's quit
// channel closes once), so the gate is in the handler: a held job keeps
// its asynq slot, which caps what the worker takes to its concurrency, and
// its lease, which asynq's heartbeat keeps extending while Redis answers.
// A job held longer than the hold time is handed back to the queue as an
// outage (ErrNotReady, not a failure) for a worker whose dependencies are
// up, and this worker takes another; so a worker cut off from storage
// alone holds at most concurrency jobs for at most the hold time each.
// When the probe says ready again, every held job goes on at once.
type Gate struct {
	hold time.Duration

	mu   sync.Mutex
	down error         // nil while open
	open chan struct{} // closed while the gate is open
	stop chan struct{} // closed by Close
	held int
	// onHeld, when set, is told how many jobs wait at the gate.
	onHeld func(int)
}

// NewGate returns a gate that holds a job at most hold (<= 0: 30 s). It
// starts shut ("not probed yet") until the first Set.
func NewGate(hold time.Duration) *Gate {
	if hold <= 0 {
		hold = defaultGateHold
	}
	return &Gate{hold: hold, down: errors.New("dependencies not probed yet"), open: make(chan struct{}), stop: make(chan struct{})}
}

// Set opens the gate (down == nil) or shuts it, naming why.
func (g *Gate) Set(down error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case down == nil && g.down != nil:
		close(g.open)
	case down != nil && g.down == nil:
		g.open = make(chan struct{})
	}
	g.down = down
}

// Close lets every held job go (as ErrNotReady) and makes Wait return at
// once from then on: the worker is shutting down, and a job it has not
// started is better back in the queue than waiting out the shutdown.
func (g *Gate) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
}

// Held returns how many jobs wait at the gate now.
func (g *Gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

func (g *Gate) addHeld(d int) {
	g.mu.Lock()
	g.held += d
	n, f := g.held, g.onHeld
	g.mu.Unlock()
	if f != nil {
		f(n)
	}
}

// gateMargin is how long before its attempt's deadline a held job is
// handed back, so that asynq never sees the deadline pass (which counts).
const gateMargin = 2 * time.Second

// Wait returns nil when the gate is open, at once or once it opens; or an
// ErrNotReady error naming the dependency down when the hold time ran out
// (or the job's deadline nears, or the gate was closed); or ctx's error.
func (g *Gate) Wait(ctx context.Context) error {
	g.mu.Lock()
	down, open, stop := g.down, g.open, g.stop
	g.mu.Unlock()
	select {
	case <-stop:
		return fmt.Errorf("%w: the worker is shutting down; the job goes back to the queue", ErrNotReady)
	default:
	}
	if down == nil {
		return nil
	}
	hold := g.hold
	if dl, ok := ctx.Deadline(); ok {
		hold = min(hold, time.Until(dl)-gateMargin)
	}
	g.addHeld(1)
	defer g.addHeld(-1)
	t := time.NewTimer(max(hold, 0))
	defer t.Stop()
	select {
	case <-open:
		return nil
	case <-stop:
		return fmt.Errorf("%w: the worker is shutting down; the job goes back to the queue", ErrNotReady)
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		g.mu.Lock()
		down = g.down
		g.mu.Unlock()
		if down == nil {
			return nil
		}
		return fmt.Errorf("%w: held %v while a dependency is down (%v); handed back to the queue", ErrNotReady, hold.Round(time.Millisecond), down)
	}
}

// streaks counts, per task id, the outages in a row that a job met on this
// worker while running (not held at the gate): asynq does not count them
// (IsFailure), so its retry count, which RetryDelay backs off by, stays
// where it was; the streak lets the delay grow anyway, so a job whose
// object alone keeps getting 5xx answers from a store that otherwise
// answers its probe is retried ever more slowly instead of every retry_base.
type streaks struct {
	mu sync.Mutex
	m  map[string]int
}

// maxStreaks bounds the map: tasks that went on to finish on another
// worker leave their entry here; past the bound the map starts over.
const maxStreaks = 4096

func (s *streaks) add(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= maxStreaks {
		s.m = map[string]int{}
	}
	s.m[id]++
	return s.m[id]
}

func (s *streaks) drop(id string) {
	s.mu.Lock()
	if s.m != nil {
		delete(s.m, id)
	}
	s.mu.Unlock()
}
