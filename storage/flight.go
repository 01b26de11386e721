package storage

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"

	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// flights shares one read of an object's start among the Heads of that
// object that overlap in time. Every job of a layer names the same w, so
// under load several of a worker's jobs Head it at once; without sharing
// each pays a request for the same few KiB.
//
// A Head that finds a read of its object in flight waits for it and takes
// a copy of its bytes (into its own pooled buffer, so TakeInline and Fetch
// work as after a read of its own) and the parsed header. The bytes come
// from a read that started before that Head did: for an object replaced
// while the two overlap, the later Head may see the version the earlier
// one read, as it would have had it started a moment sooner. Jobs' inputs
// are written before the jobs are queued, so this never shows in practice;
// WithSharedReads(false) turns sharing off. When the first read fails (its
// Head's context ended, or the object is missing), each waiting Head reads
// the object itself, so an error is always its own Head's.
type flights struct {
	mu     sync.Mutex
	m      map[string]*flight // object key -> the read in flight
	shared atomic.Int64       // Heads served by another Head's read
}

type flight struct {
	done    chan struct{} // made by the first waiter (under flights.mu), closed by finish
	waiters int           // under flights.mu; fixed once the flight leaves the map

	// Set before done is closed; read-only after.
	h    *safetensors.Header
	etag string
	data []byte // a copy of the object's start, only when waiters > 0
	err  error
}

// WithSharedReads turns the sharing of overlapping Heads of one object on
// (the default) or off. See flights.
func WithSharedReads(on bool) Option {
	return func(r *Router) {
		if on {
			r.flights = &flights{m: map[string]*flight{}}
		} else {
			r.flights = nil
		}
	}
}

// SharedReads is how many Heads were served by another Head's read of the
// same object since the Router was made.
func (r *Router) SharedReads() int64 {
	if r.flights == nil {
		return 0
	}
	return r.flights.shared.Load()
}

// join returns the flight of key: the caller's own new one (leader true),
// which it must finish, or one already in flight to wait for.
func (fs *flights) join(key string) (f *flight, done <-chan struct{}, leader bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f, ok := fs.m[key]; ok {
		if f.done == nil { // most reads finish alone: no channel for them
			f.done = make(chan struct{})
		}
		f.waiters++
		return f, f.done, false
	}
	f = &flight{}
	fs.m[key] = f
	return f, nil, true
}

// finish ends the leader's flight with its result. Heads that join after
// this start a read of their own.
func (fs *flights) finish(key string, f *flight, h *safetensors.Header, etag string, probe []byte, err error) {
	fs.mu.Lock()
	delete(fs.m, key)
	waiters, done := f.waiters, f.done
	fs.mu.Unlock()
	if waiters == 0 {
		return
	}
	if err == nil {
		// The leader's probe goes back to the pool when its job ends, which
		// may be before a waiter runs: the waiters copy from their own.
		f.data = bytes.Clone(probe)
	}
	f.h, f.etag, f.err = h, etag, err
	close(done)
}

// waiting reports how many Heads wait for key's read in flight (tests).
func (fs *flights) waiting(key string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f, ok := fs.m[key]; ok {
		return f.waiters
	}
	return 0
}

// follow waits for f and returns its result as header would: the prefix in
// a pooled buffer of the caller's own. If f failed, it reads the object
// itself.
func (r *Router) follow(ctx context.Context, f *flight, done <-chan struct{}, s Store, ref Ref, key string, probeLen int64) (*safetensors.Header, string, []byte, *[]byte, error) {
	select {
	case <-done:
	case <-ctx.Done():
		return nil, "", nil, nil, context.Cause(ctx)
	}
	if f.err != nil {
		return r.readHeader(ctx, s, ref, key, probeLen)
	}
	buf, probe := getProbe(int64(len(f.data)))
	copy(probe, f.data)
	r.flights.shared.Add(1)
	return f.h, f.etag, probe, buf, nil
}

// SharesReads reports whether overlapping Heads of one object share a read
// (WithSharedReads).
func (r *Router) SharesReads() bool { return r.flights != nil }
