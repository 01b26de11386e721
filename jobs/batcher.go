package jobs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/internal/sha256x2"
)

// ErrBatcherClosed is returned by Submit after Close: the worker is shutting
// down and the job should be retried elsewhere (transient).
var ErrBatcherClosed = errors.New("batcher closed")

// ErrDropped is wrapped (with the job's context error) when a job's context
// ended while it waited for its batch: it was dropped before encoding.
var ErrDropped = errors.New("dropped before encoding")

// BatchConfig says when the batcher flushes: whichever of the three limits is
// reached first.
type BatchConfig struct {
	MaxJobs  int           // jobs per command buffer (default 32)
	MaxBytes int64         // buffer bytes per command buffer (default 256 MiB)
	MaxWait  time.Duration // longest a job waits for batch-mates (default 2ms)
}

func (c *BatchConfig) setDefaults() {
	if c.MaxJobs <= 0 {
		c.MaxJobs = 32
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 256 << 20
	}
	if c.MaxWait <= 0 {
		c.MaxWait = 2 * time.Millisecond
	}
}

// Work is one job's buffers, allocated from the batcher's backend and filled
// by the handler. R is always computed; DX and DW are nil when the job does
// not ask for them.
type Work struct {
	X, W, DY compute.Buffer
	R        compute.Buffer
	DX, DW   compute.Buffer
	Rows     int
	Dim      int
	Eps      float32

	// sums are the sha256 of DX, DW and R (sumDX, sumDW, sumR), set by
	// the batcher after the command buffer when the job's outputs are at
	// most pairHashMax bytes (summed true); see hashOutputs.
	sums   [3][sha256.Size]byte
	summed bool
}

const (
	sumDX = iota
	sumDW
	sumR
)

// sum returns the batcher's sha256 of output i (sumDX, sumDW, sumR), or
// nil when it did not hash this job's outputs.
func (w *Work) sum(i int) *[sha256.Size]byte {
	if !w.summed {
		return nil
	}
	return &w.sums[i]
}

// pairHashMax is the most output bytes a job may have for the batcher to
// hash them (storage.Router.Write hashes larger outputs beside their
// upload, where the hashing costs no time).
const pairHashMax = 1 << 20

// hashOutputs computes the sha256 of the outputs of the batch's jobs with
// small outputs, two messages at a time (internal/sha256x2: 1.6x the rate
// of one at a time here): each job's dx with the next job's dx, dw with
// dw, r with r; a job left over pairs its own dx with its dw. A batch's
// jobs mostly share a shape, so the pairs have equal lengths. It runs on
// the batcher's goroutine after the command buffer, while every job's
// buffers are still held by its handler.
func hashOutputs(ps []*pending) {
	var small []*Work
	for _, p := range ps {
		w := p.w
		if n := len(bytesOf(w.DX)) + len(bytesOf(w.DW)) + len(bytesOf(w.R)); n <= pairHashMax {
			small = append(small, w)
		}
	}
	for i := 0; i+1 < len(small); i += 2 {
		a, b := small[i], small[i+1]
		a.sums[sumDX], b.sums[sumDX] = sha256x2.Sum2(bytesOf(a.DX), bytesOf(b.DX))
		a.sums[sumDW], b.sums[sumDW] = sha256x2.Sum2(bytesOf(a.DW), bytesOf(b.DW))
		a.sums[sumR], b.sums[sumR] = sha256x2.Sum2(bytesOf(a.R), bytesOf(b.R))
		a.summed, b.summed = true, true
	}
	if len(small)%2 == 1 {
		w := small[len(small)-1]
		w.sums[sumDX], w.sums[sumDW] = sha256x2.Sum2(bytesOf(w.DX), bytesOf(w.DW))
		w.sums[sumR] = sha256.Sum256(bytesOf(w.R))
		w.summed = true
	}
}

func bytesOf(b compute.Buffer) []byte {
	if b == nil {
		return nil
	}
	return b.Bytes()
}

// Bytes is the size of the job's buffers, what it counts against MaxBytes.
func (w *Work) Bytes() int64 {
	var n int64
	for _, b := range []compute.Buffer{w.X, w.W, w.DY, w.R, w.DX, w.DW} {
		if b != nil {
			n += int64(len(b.Bytes()))
		}
	}
	return n
}

// BatchInfo tells a job which command buffer computed it.
type BatchInfo struct {
	ID       string        // unique per worker process
	Jobs     int           // jobs encoded in that command buffer
	Device   time.Duration // the command buffer's device time
	Wait     time.Duration // from Submit to the start of encoding
	Fallback bool          // the batch's command buffer failed; this job was re-run alone
}

type pending struct {
	ctx    context.Context
	w      *Work
	queued time.Time
	done   chan batchResult // buffered 1; answered exactly once
}

type batchResult struct {
	info BatchInfo
	err  error
}

// Batcher is the one owner of the device: it collects submitted jobs into
// batches and records each batch into one compute.CommandBuffer (every job's
// rms_inv, one barrier, every job's dx and dw, one commit). While a batch
// computes, the next one fills; handlers upload their outputs in their own
// goroutines once Submit returns, so earlier batches upload meanwhile.
type Batcher struct {
	be     compute.Backend
	cfg    BatchConfig
	m      *Metrics
	log    *slog.Logger
	prefix string
	seq    atomic.Int64

	in      chan *pending
	ready   chan []*pending
	stop    chan struct{}
	stopped chan struct{} // closed when the collector no longer accepts jobs
	devDone chan struct{} // closed when the device loop has answered every job
	once    sync.Once
}

// NewBatcher starts a batcher on be. m and log may be nil.
func NewBatcher(be compute.Backend, cfg BatchConfig, m *Metrics, log *slog.Logger) *Batcher {
	cfg.setDefaults()
	if m == nil {
		m = NewMetrics(nil)
	}
	if log == nil {
		log = slog.Default()
	}
	var rb [4]byte
	_, _ = rand.Read(rb[:])
	b := &Batcher{
		be: be, cfg: cfg, m: m, log: log, prefix: hex.EncodeToString(rb[:]),
		in: make(chan *pending), ready: make(chan []*pending),
		stop: make(chan struct{}), stopped: make(chan struct{}), devDone: make(chan struct{}),
	}
	go b.collect()
	go b.device()
	return b
}

// Config returns the effective flush limits.
func (b *Batcher) Config() BatchConfig { return b.cfg }

// Submit queues w for the next batch and waits until it is computed. If ctx
// ends before the batcher took the job, Submit returns at once; once taken,
// it waits for the batcher's answer (a job dropped before encoding is
// answered at the next flush), because until then the device may be using
// w's buffers and the caller must not release them.
func (b *Batcher) Submit(ctx context.Context, w *Work) (BatchInfo, error) {
	p := &pending{ctx: ctx, w: w, queued: time.Now(), done: make(chan batchResult, 1)}
	select {
	case b.in <- p:
	case <-ctx.Done():
		return BatchInfo{}, fmt.Errorf("waiting for the batcher: %w", ctx.Err())
	case <-b.stopped:
		return BatchInfo{}, ErrBatcherClosed
	}
	r := <-p.done
	return r.info, r.err
}

// Close stops taking jobs, computes every job already taken, and returns
// when all of them have been answered. ctx bounds the wait.
func (b *Batcher) Close(ctx context.Context) error {
	b.once.Do(func() { close(b.stop) })
	select {
	case <-b.devDone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("batcher drain: %w", ctx.Err())
	}
}

// collect fills batches. It keeps at most one sealed batch waiting for the
// device besides the one filling, so jobs keep joining the next batch while
// the device computes.
func (b *Batcher) collect() {
	defer close(b.ready)
	var (
		cur    []*pending
		bytes  int64
		sealed [][]*pending
		timer  = time.NewTimer(time.Hour)
		timerC <-chan time.Time
	)
	timer.Stop()
	seal := func() {
		if len(cur) == 0 {
			return
		}
		sealed = append(sealed, cur)
		cur, bytes, timerC = nil, 0, nil
		timer.Stop()
	}
	stopping := false
	for {
		if stopping && len(cur) == 0 && len(sealed) == 0 {
			return
		}
		var send chan []*pending
		var head []*pending
		if len(sealed) > 0 {
			send, head = b.ready, sealed[0]
		}
		in := b.in
		if stopping || len(sealed) > 1 {
			in = nil // backpressure: the device is behind by a whole batch
		}
		stop := b.stop
		if stopping {
			stop = nil
		}
		select {
		case p := <-in:
			cur = append(cur, p)
			bytes += p.w.Bytes()
			if len(cur) == 1 {
				timer.Reset(b.cfg.MaxWait)
				timerC = timer.C
			}
			if len(cur) >= b.cfg.MaxJobs || bytes >= b.cfg.MaxBytes {
				seal()
			}
		case <-timerC:
			timerC = nil
			seal()
		case send <- head:
			sealed = sealed[1:]
			// The device just took a batch: an idle device should not wait
			// out MaxWait for a partial batch that is already its best.
		case <-stop:
			stopping = true
			close(b.stopped)
			seal()
		}
	}
}

func (b *Batcher) device() {
	defer close(b.devDone)
	for batch := range b.ready {
		b.run(batch)
	}
}

// run encodes and commits one batch. The commit uses a background context:
// jobs whose context ends after encoding still finish, because their buffers
// are in the device's hands and the result is cheap to keep.
func (b *Batcher) run(batch []*pending) {
	start := time.Now()
	live := batch[:0:0]
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			p.done <- batchResult{err: fmt.Errorf("%w: %w", ErrDropped, err)}
			continue
		}
		live = append(live, p)
	}
	if len(live) == 0 {
		return
	}
	id := fmt.Sprintf("%s-%d", b.prefix, b.seq.Add(1))
	cb := compute.NewCommandBuffer(b.be)
	ok := live[:0:0]
	for _, p := range live {
		if err := encodeRMSInv(cb, p.w); err != nil {
			b.logPanic(id, err)
			p.done <- batchResult{err: err}
			continue
		}
		ok = append(ok, p)
	}
	cb.Barrier()
	enc := ok[:0:0]
	for _, p := range ok {
		if err := encodeGrads(cb, p.w); err != nil {
			// Its rms_inv is already recorded: harmless, it writes only
			// this job's r, which nobody reads.
			b.logPanic(id, err)
			p.done <- batchResult{err: err}
			continue
		}
		enc = append(enc, p)
	}
	if len(enc) == 0 {
		return
	}
	t, err := commit(cb)
	b.m.DeviceBusy.Add(t.Device.Seconds())
	b.logPanic(id, err)
	if err == nil {
		b.m.BatchSize.Observe(float64(len(enc)))
		hashOutputs(enc)
		for _, p := range enc {
			p.done <- batchResult{info: BatchInfo{ID: id, Jobs: len(enc), Device: t.Device, Wait: start.Sub(p.queued)}}
		}
		return
	}
	if len(enc) == 1 {
		enc[0].done <- batchResult{err: fmt.Errorf("batch %s: commit: %w", id, err)}
		return
	}
	// One bad job (or a flaky device) must not fail its batch-mates: re-run
	// each job in its own command buffer and answer each with its own fate.
	b.m.Fallbacks.Inc()
	b.log.Warn("batch command buffer failed; re-running its jobs one by one", "batch_id", id, "jobs", len(enc), "err", err)
	for i, p := range enc {
		sid := fmt.Sprintf("%s/%d", id, i)
		one := compute.NewCommandBuffer(b.be)
		e := encodeRMSInv(one, p.w)
		if e == nil {
			one.Barrier()
			e = encodeGrads(one, p.w)
		}
		var t1 compute.Timing
		if e == nil {
			t1, e = commit(one)
			b.m.DeviceBusy.Add(t1.Device.Seconds())
		}
		b.logPanic(sid, e)
		if e != nil {
			p.done <- batchResult{err: fmt.Errorf("batch %s (alone, after the batch of %d failed): %w", sid, len(enc), e)}
			continue
		}
		b.m.BatchSize.Observe(1)
		p.done <- batchResult{info: BatchInfo{ID: sid, Jobs: 1, Device: t1.Device, Wait: start.Sub(p.queued), Fallback: true}}
	}
}

// BackendPanic is a panic raised while a batch was encoded or committed
// (a bug in a backend or its kernels' host code), recovered on the
// batcher's goroutine and answered as the job's error, so one bad job
// cannot end the worker and every job it holds. A batch that raises one
// is re-run a job at a time, as for any failed batch, so only the job
// that raises it again fails; asynq retries it like any transient
// failure (outcome="panic") and archives it after max_retry.
type BackendPanic struct {
	Value any
	Stack []byte // where it was raised
}

func (p *BackendPanic) Error() string {
	return fmt.Sprintf("panic in the compute backend: %v", p.Value)
}

// recoverBackend, deferred, turns a panic into a *BackendPanic in *err.
// A backend that computes on goroutines of its own raises their panics
// again on the caller's (compute/cpu does), carrying the stack where it
// happened in a GoroutineStack method.
func recoverBackend(err *error) {
	x := recover()
	if x == nil {
		return
	}
	p := &BackendPanic{Value: x}
	if g, ok := x.(interface{ GoroutineStack() []byte }); ok {
		p.Stack = g.GoroutineStack()
	} else {
		p.Stack = debug.Stack()
	}
	*err = p
}

// logPanic logs a recovered backend panic with its stack, once, at error:
// a job's error carries only its value.
func (b *Batcher) logPanic(batch string, err error) {
	var p *BackendPanic
	if errors.As(err, &p) {
		b.log.Error("compute backend panicked; its jobs are answered with the panic and the worker carries on", "batch_id", batch, "panic", fmt.Sprint(p.Value), "stack", string(p.Stack))
	}
}

func commit(cb *compute.CommandBuffer) (t compute.Timing, err error) {
	defer recoverBackend(&err)
	return cb.Commit(context.Background())
}

func encodeRMSInv(cb *compute.CommandBuffer, w *Work) (err error) {
	defer recoverBackend(&err)
	return cb.RMSInv(w.X, w.R, compute.RMSInvParams(w.Eps, w.Dim), w.Rows, w.Dim)
}

func encodeGrads(cb *compute.CommandBuffer, w *Work) (err error) {
	defer recoverBackend(&err)
	if w.DX != nil {
		if err := cb.DX(w.X, w.W, w.DY, w.R, w.DX, compute.DXParams(w.Dim, w.Eps), w.Rows, w.Dim); err != nil {
			return err
		}
	}
	if w.DW != nil {
		if err := cb.DW(w.X, w.DY, w.R, w.DW, compute.DWParams(w.Dim, w.Rows), w.Rows, w.Dim); err != nil {
			return err
		}
	}
	return nil
}
