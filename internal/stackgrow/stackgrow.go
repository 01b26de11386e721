// Package stackgrow grows a goroutine's stack ahead of a deep call path.
//
// A goroutine's stack starts small and doubles when a call needs more;
// each doubling copies the frames already on the stack and walks every
// one of them to fix its pointers, so growing at the bottom of a deep path
// (a job's handler down to a socket write) costs far more than growing at
// its top. Grow, called first thing on a fresh goroutine, makes the one
// growth happen while the stack holds a few frames. Cheaper still is no
// growth at all: Pool keeps goroutines whose stacks have grown, for paths
// handed over from a goroutine the caller does not own (asynq starts one
// per task, and even one early growth there walks asynq's frames).
package stackgrow

import "sync/atomic"

// Grow grows the calling goroutine's stack to 16 KiB, the largest stack
// the Go runtime serves from its per-P caches, unless it is that large
// already (then it costs a stack check and zeroing 8 KiB). The stack stays
// grown until the goroutine ends or the GC shrinks an idle one.
//
//go:noinline
func Grow() {
	var pad [8 << 10]byte
	keep(pad[:])
}

// keep stops the compiler from dropping Grow's frame.
//
//go:noinline
func keep([]byte) {}

// Pool runs short functions on goroutines that stay parked between uses
// instead of exiting, their stacks grown (Grow) before each function: a
// path handed to one skips the growths a fresh goroutine's would make. Up
// to max goroutines are kept; past that a function runs on a fresh one.
type Pool struct {
	work chan func()
	n    atomic.Int32
	max  int32
}

// NewPool returns a pool that keeps up to max goroutines.
func NewPool(max int) *Pool {
	return &Pool{work: make(chan func()), max: int32(max)}
}

// Go runs f on an idle goroutine of the pool, on a new one kept in the
// pool while fewer than max are, or else on a fresh goroutine. It does
// not wait for f.
func (p *Pool) Go(f func()) {
	select {
	case p.work <- f: // an idle goroutine took it
		return
	default:
	}
	if p.n.Add(1) <= p.max {
		go p.loop(f)
		return
	}
	p.n.Add(-1)
	go f()
}

// Len is how many goroutines the pool keeps.
func (p *Pool) Len() int { return int(p.n.Load()) }

func (p *Pool) loop(f func()) {
	for {
		// Regrow at once what the GC took back from an idle goroutine's
		// stack, before f's frames are on it (a no-op when it is grown).
		Grow()
		f()
		f = <-p.work
	}
}
