package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
)

// ErrNeverFits is wrapped when a job needs more bytes than the whole memory
// budget: waiting cannot help, so the job is rejected as permanent.
var ErrNeverFits = errors.New("job can never fit the memory budget")

// Budget bounds the bytes of tensor buffers in flight in one worker: a
// handler reserves its job's bytes before allocating and releases them after
// the output is stored. Waiters are served in FIFO order, so a large job is
// not starved by a stream of small ones.
type Budget struct {
	capacity int64
	sem      *semaphore.Weighted
	inUse    atomic.Int64
	onChange func(inUse int64) // metrics hook; may be nil
}

// NewBudget returns a budget of capacity bytes (> 0).
func NewBudget(capacity int64) *Budget {
	if capacity <= 0 {
		panic(fmt.Sprintf("jobs.NewBudget: capacity %d must be > 0", capacity))
	}
	return &Budget{capacity: capacity, sem: semaphore.NewWeighted(capacity)}
}

// Capacity returns the budget's size in bytes.
func (b *Budget) Capacity() int64 { return b.capacity }

// InUse returns the bytes reserved right now.
func (b *Budget) InUse() int64 { return b.inUse.Load() }

// Acquire reserves n bytes, waiting until they are free or ctx ends. A
// request larger than the capacity fails at once with ErrNeverFits.
func (b *Budget) Acquire(ctx context.Context, n int64) error {
	if n > b.capacity {
		return fmt.Errorf("%w: needs %d bytes, budget (budget_bytes, RMSGRAD_BUDGET_BYTES) is %d", ErrNeverFits, n, b.capacity)
	}
	if n <= 0 {
		return nil
	}
	if err := b.sem.Acquire(ctx, n); err != nil {
		return fmt.Errorf("waiting for %d bytes of memory budget (%d of %d in use): %w", n, b.InUse(), b.capacity, err)
	}
	v := b.inUse.Add(n)
	if b.onChange != nil {
		b.onChange(v)
	}
	return nil
}

// Release returns n bytes reserved by Acquire.
func (b *Budget) Release(n int64) {
	if n <= 0 {
		return
	}
	v := b.inUse.Add(-n)
	b.sem.Release(n)
	if b.onChange != nil {
		b.onChange(v)
	}
}
