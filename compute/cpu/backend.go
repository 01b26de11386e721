package cpu

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
)

// Name is the backend's name.
const Name = "cpu"

// Option configures New.
type Option func(*Backend)

// Threads sets how many goroutines Execute uses; 0 (the default) means
// runtime.GOMAXPROCS(0) at each Execute. Outputs do not depend on it.
func Threads(n int) Option { return func(b *Backend) { b.threads = n } }

// Scalar makes the backend use the pure-Go row primitives even where
// assembly is available (for comparison; the bits are the same).
func Scalar() Option { return func(b *Backend) { b.pr = goPrims } }

// PoolLimit bounds the backend's buffers, in use and kept for reuse
// together, to n bytes: a released buffer that would go over it is left to
// the garbage collector instead of the pool. A worker passes its memory
// budget, so buffers of shapes it no longer sees do not hold memory beyond
// the budget. 0 (the default) keeps up to 4 GiB for reuse.
func PoolLimit(n int64) Option { return func(b *Backend) { b.pool.limit = int(n / 4) } }

// Backend is the pure-Go compute.Backend. It is safe for concurrent use.
type Backend struct {
	threads int
	pr      *prims
	noFuse  bool // tests: run every op on its own, to compare bits
	pool    pool
	scratch sync.Pool // *scratch of the task runners
}

var (
	_ compute.Backend     = (*Backend)(nil)
	_ compute.HostAdopter = (*Backend)(nil)
)

// New returns a CPU backend.
func New(opts ...Option) *Backend {
	b := &Backend{pr: best}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Open returns a CPU backend with default options as a compute.Backend; it
// never fails, the error is there to match the other backends' Open.
func Open() (compute.Backend, error) { return New(), nil }

// Name returns "cpu".
func (b *Backend) Name() string { return Name }

// PoolStats reports the buffer pool: bytes of the buffers handed out and
// not released, bytes kept for reuse, and the limit (PoolLimit; 0: none).
func (b *Backend) PoolStats() (live, pooled, limit int64) {
	b.pool.mu.Lock()
	defer b.pool.mu.Unlock()
	return int64(b.pool.out) * 4, int64(b.pool.retained) * 4, int64(b.pool.limit) * 4
}

// DeviceName says how many threads and which vector unit and conversion
// instructions run the kernels, e.g. "cpu (2 threads, avx2+f16c+avx512bf16)".
func (b *Backend) DeviceName() string {
	return fmt.Sprintf("cpu (%d threads, %s)", b.nthreads(), b.pr.name)
}

func (b *Backend) nthreads() int {
	if b.threads > 0 {
		return b.threads
	}
	return runtime.GOMAXPROCS(0)
}

// Alloc returns a host buffer of the given dtype and shape from the pool.
// Contents of a reused buffer are unspecified.
func (b *Backend) Alloc(dtype compute.DType, shape ...int) (compute.Buffer, error) {
	if dtype.Size() == 0 {
		return nil, fmt.Errorf("cpu: alloc: dtype %q: %w", dtype, compute.ErrInvalidArgument)
	}
	n := compute.NumElements(shape)
	if n < 0 || n > compute.MaxElements {
		return nil, fmt.Errorf("cpu: alloc: shape %v: %w", shape, compute.ErrInvalidArgument)
	}
	return newBuffer(b, dtype, shape, n), nil
}

// Close drops the pool; buffers are Go memory, so nothing else is held.
func (b *Backend) Close() error {
	b.pool.mu.Lock()
	b.pool.free, b.pool.retained = nil, 0
	b.pool.mu.Unlock()
	return nil
}

// Execute runs ops phase by phase (a phase is the ops between two
// barriers), each phase's work spread over the backend's threads. It
// returns the wall time spent.
func (b *Backend) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	start := time.Now()
	p, err := b.plan(ops)
	if err != nil {
		return 0, err
	}
	defer p.release()
	err = p.run(ctx, b.nthreads())
	return time.Since(start), err
}
