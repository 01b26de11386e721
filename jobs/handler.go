package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/internal/stackgrow"
	"github.com/rmsgrad/rmsgrad/storage"
)

// Limits bound one job. Zero fields take the defaults.
type Limits struct {
	// MaxElements bounds x's element count (rows*dim); default and ceiling
	// compute.MaxElements.
	MaxElements int64
	// MaxBytes bounds the job's buffer bytes: x, w, dy, r and the requested
	// outputs; default 1 GiB.
	MaxBytes int64
}

func (l *Limits) setDefaults() {
	if l.MaxElements <= 0 || l.MaxElements > compute.MaxElements {
		l.MaxElements = compute.MaxElements
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = 1 << 30
	}
}

// HandlerConfig wires a Handler. Backend, Batcher, Store and Budget are
// required.
type HandlerConfig struct {
	Backend    compute.Backend
	Batcher    *Batcher
	Store      Store
	Budget     *Budget
	Limits     Limits
	SigningKey []byte // when set, unsigned or mis-signed jobs are rejected
	Worker     string // this worker's name, reported in results
	Metrics    *Metrics
	Logger     *slog.Logger
	// Gate, when set, holds each job before its first storage request
	// while a dependency of the worker is down (see Gate).
	Gate *Gate
	// Pins keeps the w tensors that jobs pinned with w_sha256 once they
	// were read and checked (nil: every pinned w is read and checked).
	Pins *PinCache
}

// Handler processes rmsnorm:backward tasks: decode, validate, check the
// allow-list, read headers, reserve budget, fetch into backend buffers, hand
// the job to the batcher, store the outputs and write the Result.
//
// NaN/Inf policy: an input holding NaN or Inf is rejected as permanent with
// the tensor's name, the count of non-finite values and the first index; an
// output that comes out non-finite (e.g. overflow) fails the job
// permanently. A result is never silently non-finite.
type Handler struct {
	cfg HandlerConfig
	m   *Metrics
	log *slog.Logger
	// stage holds the rmsgrad_stage_seconds child of each stage, looked up
	// once: WithLabelValues hashes the label and locks the vector on every
	// call (six times a job).
	stage map[string]prometheus.Observer
	// jobsOK is rmsgrad_jobs_total{outcome="ok"}, looked up once.
	jobsOK prometheus.Counter
	// pinHit, pinMiss and pinMismatch are rmsgrad_w_pins_total's
	// children, looked up once.
	pinHit, pinMiss, pinMismatch prometheus.Counter
	// tensors holds the rmsgrad_tensors_total child of each tensor and
	// dtype, looked up once.
	tensors map[tensorKey]prometheus.Counter
	// adopter and taker are Backend and Store when they can hand a small
	// input's bytes from the header read to the compute without a copy
	// (both nil otherwise).
	adopter compute.HostAdopter
	taker   InlineTaker
	// streak counts outages in a row per task (see streaks).
	streak streaks
}

// NewHandler checks cfg and returns a Handler.
func NewHandler(cfg HandlerConfig) (*Handler, error) {
	if cfg.Backend == nil || cfg.Batcher == nil || cfg.Store == nil || cfg.Budget == nil {
		return nil, errors.New("jobs.NewHandler: Backend, Batcher, Store and Budget are required")
	}
	cfg.Limits.setDefaults()
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &Handler{cfg: cfg, m: cfg.Metrics, log: cfg.Logger, stage: map[string]prometheus.Observer{}}
	h.jobsOK = cfg.Metrics.Jobs.WithLabelValues(OutcomeOK)
	h.pinHit, h.pinMiss, h.pinMismatch = cfg.Metrics.Pins.WithLabelValues(PinHit), cfg.Metrics.Pins.WithLabelValues(PinMiss), cfg.Metrics.Pins.WithLabelValues(PinMismatch)
	h.tensors = map[tensorKey]prometheus.Counter{}
	for _, t := range []string{"x", "w", "dy", OutDX, OutDW} {
		for _, dt := range compute.DTypes {
			h.tensors[tensorKey{t, dt}] = cfg.Metrics.Tensors.WithLabelValues(t, string(dt))
		}
	}
	if a, ok := cfg.Backend.(compute.HostAdopter); ok {
		if t, ok := cfg.Store.(InlineTaker); ok {
			h.adopter, h.taker = a, t
		}
	}
	for _, st := range []string{StageQueueWait, StageFetch, StageBatchWait, StageCompute, StageStore, StageTotal} {
		h.stage[st] = cfg.Metrics.Stage.WithLabelValues(st)
	}
	if g := cfg.Gate; g != nil {
		g.mu.Lock()
		g.onHeld = func(n int) { h.m.Held.Set(float64(n)) }
		g.mu.Unlock()
	}
	if cfg.Pins != nil {
		cfg.Pins.mu.Lock()
		cfg.Pins.onSize = func(n int64) { h.m.PinBytes.Set(float64(n)) }
		cfg.Pins.mu.Unlock()
	}
	prev := cfg.Budget.onChange
	cfg.Budget.onChange = func(v int64) {
		h.m.InFlight.Set(float64(v))
		if prev != nil {
			prev(v)
		}
	}
	return h, nil
}

// Register routes TaskType to h on mux.
func (h *Handler) Register(mux *asynq.ServeMux) { mux.Handle(TaskType, h) }

// ProcessTask implements asynq.Handler. asynq calls it on a fresh
// goroutine per task, whose stack starts small: the job's path would grow
// it (each growth allocates a stack, copies the frames and walks every one
// of them to fix its pointers; runtime.newstack was 20-25 us per small job
// in the worker's profile, and growing it once up front still cost about
// 10, the walk through asynq's frames on cold caches). So the job runs on
// one of the helper goroutines kept between jobs, whose stacks have grown
// already, and this goroutine waits for it. A panic in the job is carried
// back here and raised again, with the job's own stack in its message, so
// asynq recovers it as before and the helper lives on. Before it is raised
// again, the job is counted (outcome "panic") and logged at error level
// with its task id and that stack: asynq's own log of the recovery has no
// task id, and its stack is this goroutine's, which raised it again.
func (h *Handler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	c := callPool.Get().(*call)
	c.h, c.ctx, c.t = h, ctx, t
	helperPool.Go(c.fn)
	<-c.done
	err, p := c.err, c.panicked
	*c = call{done: c.done, fn: c.fn}
	callPool.Put(c)
	if p != nil {
		h.m.Jobs.WithLabelValues(OutcomePanic).Inc()
		id, _ := asynq.GetTaskID(ctx)
		h.log.LogAttrs(ctx, slog.LevelError, "job panicked", slog.String("task_id", id), slog.String("outcome", OutcomePanic),
			slog.String("panic", fmt.Sprint(p.val)), slog.String("stack", string(p.stack)))
		panic(p)
	}
	return err
}

// call is one ProcessTask handed to a helper; pooled with its channel and
// its bound method value, so a hand-off allocates nothing.
type call struct {
	h        *Handler
	ctx      context.Context
	t        *asynq.Task
	err      error
	panicked *jobPanic
	done     chan struct{}
	fn       func()
}

var callPool = sync.Pool{New: func() any {
	c := &call{done: make(chan struct{}, 1)}
	c.fn = c.run
	return c
}}

func (c *call) run() {
	defer func() {
		if x := recover(); x != nil {
			c.panicked = newJobPanic(x)
		}
		c.done <- struct{}{}
	}()
	c.err = c.h.processTask(c.ctx, c.t)
}

// jobPanic is a panic in a job's path, raised again on asynq's goroutine:
// its message carries the stack where it happened.
type jobPanic struct {
	val   any
	stack []byte
}

// newJobPanic records a recovered panic and where it happened; one raised
// again from a helper keeps its first stack.
func newJobPanic(x any) *jobPanic {
	if p, ok := x.(*jobPanic); ok {
		return p
	}
	return &jobPanic{val: x, stack: debug.Stack()}
}

func (p *jobPanic) Error() string {
	return fmt.Sprintf("%v\n\njob goroutine's stack:\n%s", p.val, p.stack)
}

// deadlineMargin is how long before its attempt's deadline a job's work
// stops (a tenth of the time left, when that is less).
const deadlineMargin = 2 * time.Second

// processTask is the task's whole path: decode, run, account, log.
func (h *Handler) processTask(ctx context.Context, t *asynq.Task) error {
	id, _ := asynq.GetTaskID(ctx)
	jctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		// The job's work ends a little before the attempt's deadline, so
		// that its own error, naming the job, tensor and URI, reaches
		// asynq first: asynq records a bare "context deadline exceeded"
		// when the deadline passes while the handler runs.
		margin := min(deadlineMargin, time.Until(dl)/10)
		var cancel context.CancelFunc
		jctx, cancel = context.WithDeadline(ctx, dl.Add(-margin))
		defer cancel()
	}
	res, err := h.process(jctx, id, t.Payload(), t.ResultWriter())
	outcome := OutcomeOK
	switch {
	case err == nil:
	case IsPermanent(err):
		outcome = OutcomePermanent
	case ctx.Err() != nil:
		outcome = OutcomeCanceled
	case errors.Is(err, ErrNotReady):
		outcome = OutcomeHeld
	case errors.As(err, new(*BackendPanic)):
		outcome = OutcomePanic
	case IsOutage(err):
		outcome = OutcomeOutage
		var je *JobError
		if errors.As(err, &je) {
			je.OutageStreak = h.streak.add(id)
		}
	default:
		outcome = OutcomeRetry
	}
	if outcome != OutcomeOutage && outcome != OutcomeHeld {
		h.streak.drop(id)
	}
	if outcome == OutcomeOK {
		h.jobsOK.Inc()
	} else {
		h.m.Jobs.WithLabelValues(outcome).Inc()
	}
	// LogAttrs with the task's id as a plain attribute: Logger.With would
	// build (and the JSON handler pre-format) a logger per job.
	if err != nil {
		level, msg := failureLevel(ctx, outcome)
		h.log.LogAttrs(ctx, level, msg, slog.String("task_id", id), slog.String("outcome", outcome), slog.Any("err", err))
		return err
	}
	h.logDone(ctx, id, res)
	return nil
}

// failureLevel is the level and message of a failed job's one log line.
// A permanent failure is bad input (or a job the worker may not run):
// the normal outcome of a bad submission, reported to its submitter in
// the task's error, so info, like "job done". A transient failure that
// will be retried is a warning (storage or Redis trouble an operator may
// have to see to); one with no retry left ends archived, which is an
// error. asynq's own "Retry exhausted" line is debug (internal/logs).
func failureLevel(ctx context.Context, outcome string) (slog.Level, string) {
	switch outcome {
	case OutcomePermanent:
		return slog.LevelInfo, "job rejected"
	case OutcomeRetry, OutcomePanic:
		retried, ok1 := asynq.GetRetryCount(ctx)
		limit, ok2 := asynq.GetMaxRetry(ctx)
		if ok1 && ok2 && retried >= limit {
			return slog.LevelError, "job failed after its last retry: archived"
		}
		if outcome == OutcomePanic {
			return slog.LevelError, "job failed: the compute backend panicked; will retry"
		}
		return slog.LevelWarn, "job failed: will retry"
	case OutcomeOutage:
		return slog.LevelWarn, "job met an outage: back in the queue, not counted as a retry"
	case OutcomeHeld:
		// The probe's "dependency down: not ready" line is the warning.
		return slog.LevelInfo, "job held while a dependency is down: back in the queue, not counted as a retry"
	default: // canceled: shutdown (or the attempt's deadline, past the job's margin); asynq puts it back
		return slog.LevelWarn, "job canceled"
	}
}

// logDone writes the per-job "job done" line, the one log line every job
// makes. It builds the record itself: Logger.LogAttrs would walk the stack
// for a source position the worker does not log (runtime.Callers, 2 us a
// job on the development VM). The total is whole microseconds because
// slog's JSON handler formats every float64 through encoding/json (5 us).
func (h *Handler) logDone(ctx context.Context, id string, res *Result) {
	if !h.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	r := slog.NewRecord(time.Now(), slog.LevelInfo, "job done", 0)
	r.AddAttrs(slog.String("task_id", id), slog.String("out", res.Out),
		slog.Int("rows", res.Rows), slog.Int("dim", res.Dim), slog.String("batch_id", res.BatchID),
		slog.Int("batch_jobs", res.BatchJobs), slog.Int64("total_us", res.totalUS))
	_ = h.log.Handler().Handle(ctx, r)
}

var inputNames = [3]string{"x", "w", "dy"}

// tensorKey names a child of rmsgrad_tensors_total.
type tensorKey struct {
	tensor string
	dt     compute.DType
}

func (h *Handler) process(ctx context.Context, id string, payload []byte, rw *asynq.ResultWriter) (*Result, error) {
	start := time.Now()
	j, err := Decode(payload)
	if err != nil {
		return nil, jobErr(id, "", "", err)
	}
	if h.cfg.SigningKey != nil {
		if err := j.Verify(h.cfg.SigningKey); err != nil {
			h.m.BadSignatures.Inc()
			return nil, jobErr(id, "", "", err)
		}
	}
	var tm Timings
	if j.EnqueuedNS > 0 {
		if w := start.Sub(time.Unix(0, j.EnqueuedNS)); w > 0 {
			tm.QueueWait = ms(w)
			h.stage[StageQueueWait].Observe(w.Seconds())
		}
	}
	uris := [3]string{j.X, j.W, j.DY}
	for i, u := range uris {
		if err := h.cfg.Store.Check(u, false); err != nil {
			return nil, jobErr(id, inputNames[i], u, err)
		}
	}
	if err := h.cfg.Store.Check(j.Out, true); err != nil {
		return nil, jobErr(id, "out", j.Out, err)
	}
	if h.cfg.Gate != nil {
		if err := h.cfg.Gate.Wait(ctx); err != nil {
			return nil, jobErr(id, "", "", err)
		}
	}

	// A pinned w that an earlier job read and checked is taken from memory:
	// its header is the one read then, its bytes hash to this job's pin.
	var pin *pinned
	if j.WSHA256 != "" {
		var hit bool
		if pin, hit = h.cfg.Pins.get(j.W, j.WSHA256); hit {
			h.pinHit.Inc()
		} else {
			h.pinMiss.Inc()
		}
	}

	// Headers first: shapes, dtypes and sizes are checked before data moves.
	var infos [3]TensorInfo
	if pin != nil {
		infos[1] = TensorInfo{URI: j.W, DType: pin.dtype, Shape: slices.Clone(pin.shape), Size: int64(len(pin.data)), Local: true}
	}
	err = each3(ctx, func(ctx context.Context, i int) error {
		if i == 1 && pin != nil {
			return nil
		}
		ti, err := h.cfg.Store.Head(ctx, uris[i])
		if err != nil {
			return jobErr(id, inputNames[i], uris[i], err)
		}
		infos[i] = ti
		return nil
	})
	if err != nil {
		return nil, err
	}
	rows, dim, err := h.checkShapes(id, infos)
	if err != nil {
		return nil, err
	}
	want := j.WantOutputs()
	wantDX, wantDW, wantR := slices.Contains(want, OutDX), slices.Contains(want, OutDW), slices.Contains(want, OutR)
	// Each tensor in its own dtype: the inputs as their headers say, dx and
	// dw as the job asks (GradDType) or like x and w; r is F32. Bytes,
	// limits and the budget count each tensor's own element size.
	dts := [3]compute.DType{compute.DType(infos[0].DType), compute.DType(infos[1].DType), compute.DType(infos[2].DType)}
	dxT, dwT := j.GradDTypes(dts[0], dts[1])
	n := int64(rows) * int64(dim)
	need := n*int64(dts[0].Size()) + int64(dim)*int64(dts[1].Size()) + n*int64(dts[2].Size()) + 4*int64(rows)
	if wantDX {
		need += n * int64(dxT.Size())
	}
	if wantDW {
		need += int64(dim) * int64(dwT.Size())
	}
	if need > h.cfg.Limits.MaxBytes {
		return nil, jobErr(id, "x", j.X, limitErr("job needs %d buffer bytes (x %v %s, w %s, dy %s, outputs %v as dx %s, dw %s, r F32), limit (limits.max_job_bytes) is %d",
			need, infos[0].Shape, dts[0], dts[1], dts[2], want, dxT, dwT, h.cfg.Limits.MaxBytes))
	}
	if err := h.cfg.Budget.Acquire(ctx, need); err != nil {
		return nil, jobErr(id, "", "", err)
	}
	defer h.cfg.Budget.Release(need)

	w := &Work{Rows: rows, Dim: dim, Eps: float32(j.Eps)}
	var bufs []compute.Buffer
	defer func() {
		for _, b := range bufs {
			b.Release()
		}
	}()
	alloc := func(name string, dt compute.DType, shape ...int) (compute.Buffer, error) {
		b, err := h.cfg.Backend.Alloc(dt, shape...)
		if err != nil {
			return nil, jobErr(id, name, "", fmt.Errorf("alloc %s %v: %w", dt, shape, err))
		}
		bufs = append(bufs, b)
		return b, nil
	}
	// Inputs, each a buffer of its own dtype. A small tensor that its
	// header read already holds becomes the buffer itself when the backend
	// computes on host memory (the cpu backend): no allocation and no
	// copy. The others are allocated here and range-read below.
	shapes := [3][]int{{rows, dim}, {dim}, {rows, dim}}
	var dsts [3]compute.Buffer
	var filled [3]bool // holds the data already
	for i := range 3 {
		if need := int64(dts[i].Size()) * int64(compute.NumElements(shapes[i])); need != infos[i].Size {
			return nil, jobErr(id, inputNames[i], uris[i], fmt.Errorf("%w: header says %d data bytes, shape %v of %s needs %d", storage.ErrFormat, infos[i].Size, infos[i].Shape, dts[i], need))
		}
		if i == 1 && pin != nil {
			if dsts[i], err = alloc(inputNames[i], dts[i], shapes[i]...); err != nil {
				return nil, err
			}
			copy(dsts[i].Bytes(), pin.data)
			filled[i] = true
			continue
		}
		if b := h.adopt(infos[i], dts[i], shapes[i]); b != nil {
			bufs = append(bufs, b)
			dsts[i], filled[i] = b, true
			continue
		}
		if dsts[i], err = alloc(inputNames[i], dts[i], shapes[i]...); err != nil {
			return nil, err
		}
	}
	w.X, w.W, w.DY = dsts[0], dsts[1], dsts[2]
	if w.R, err = alloc("r", compute.F32, rows); err != nil {
		return nil, err
	}
	if wantDX {
		if w.DX, err = alloc("dx", dxT, rows, dim); err != nil {
			return nil, err
		}
	}
	if wantDW {
		if w.DW, err = alloc("dw", dwT, dim); err != nil {
			return nil, err
		}
	}

	// Range-read each other tensor straight into its buffer: no staging
	// copy.
	fetch := each3
	if infos[0].Local && infos[1].Local && infos[2].Local {
		// At most three copies out of the header reads (a small job):
		// goroutines would cost more than the copies they spread.
		fetch = seq3
	}
	err = fetch(ctx, func(ctx context.Context, i int) error {
		if !filled[i] {
			if err := h.cfg.Store.Fetch(ctx, infos[i], dsts[i].Bytes()); err != nil {
				return jobErr(id, inputNames[i], uris[i], err)
			}
		}
		if err := checkFiniteBuf(dsts[i]); err != nil {
			return jobErr(id, inputNames[i], uris[i], fmt.Errorf("input: %w", err))
		}
		if i == 1 && j.WSHA256 != "" && pin == nil {
			return h.checkPin(id, &j, infos[1], dsts[1].Bytes())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	h.m.BytesIn.Add(float64(infos[0].Size + infos[1].Size + infos[2].Size))
	fetched := time.Now()
	tm.Fetch = ms(fetched.Sub(start))
	h.stage[StageFetch].Observe(fetched.Sub(start).Seconds())

	bi, err := h.cfg.Batcher.Submit(ctx, w)
	if err != nil {
		return nil, jobErr(id, "", "", err)
	}
	if err := checkRowScale(w.R.Float32s()); err != nil {
		return nil, jobErr(id, "x", j.X, fmt.Errorf("batch %s: %w", bi.ID, err))
	}
	computed := time.Now()
	tm.Batch = ms(bi.Wait)
	tm.Compute = ms(bi.Device)
	h.stage[StageBatchWait].Observe(bi.Wait.Seconds())
	h.stage[StageCompute].Observe(bi.Device.Seconds())

	var outs []OutTensor
	dtypes := make(map[string]string, 3)
	add := func(name string, b compute.Buffer, shape []int, sum int) error {
		if err := checkFiniteBuf(b); err != nil {
			return jobErr(id, name, j.Out, fmt.Errorf("output (batch %s): %w", bi.ID, err))
		}
		dt := string(b.DType())
		outs = append(outs, OutTensor{Name: name, DType: dt, Shape: shape, Data: b.Bytes(), SHA256: w.sum(sum)})
		dtypes[name] = dt
		return nil
	}
	if wantDX {
		if err := add(OutDX, w.DX, slices.Clone(infos[0].Shape), sumDX); err != nil {
			return nil, err
		}
	}
	if wantDW {
		if err := add(OutDW, w.DW, []int{dim}, sumDW); err != nil {
			return nil, err
		}
	}
	if wantR {
		if err := add(OutR, w.R, []int{rows}, sumR); err != nil {
			return nil, err
		}
	}
	// The metadata depends only on the job, so a retried or duplicated job
	// rewrites the identical object.
	meta := map[string]string{"producer": "rmsgrad", "op": TaskType, "eps": strconv.FormatFloat(j.Eps, 'g', -1, 64)}
	sums, nbytes, err := h.cfg.Store.Write(ctx, j.Out, outs, meta)
	if err != nil {
		return nil, jobErr(id, "out", j.Out, err)
	}
	h.m.BytesOut.Add(float64(nbytes))
	stored := time.Now()
	tm.Store = ms(stored.Sub(computed))
	h.stage[StageStore].Observe(stored.Sub(computed).Seconds())

	h.countDTypes(dts, w)
	res := &Result{
		Out: j.Out, SHA256: sums, DTypes: dtypes, Rows: rows, Dim: dim,
		Backend: h.cfg.Backend.Name(), Device: h.cfg.Backend.DeviceName(), Worker: h.cfg.Worker,
		BatchID: bi.ID, BatchJobs: bi.Jobs,
	}
	total := time.Since(start)
	tm.Total = ms(total)
	res.Timings = tm
	res.totalUS = total.Microseconds()
	h.stage[StageTotal].Observe(total.Seconds())
	if rw != nil {
		b, err := res.marshal()
		if err != nil {
			return nil, jobErr(id, "", "", fmt.Errorf("encode result: %w", err))
		}
		if err := writeResult(ctx, rw, b); err != nil {
			// The output is stored; a retry rewrites the same bytes and
			// tries the result again.
			return nil, jobErr(id, "", "", fmt.Errorf("%w: %w", ErrResultUnavailable, err))
		}
	}
	return res, nil
}

// countDTypes adds a finished job's tensors to rmsgrad_tensors_total.
func (h *Handler) countDTypes(in [3]compute.DType, w *Work) {
	for i, dt := range in {
		h.tensors[tensorKey{inputNames[i], dt}].Inc()
	}
	for _, o := range [...]struct {
		name string
		b    compute.Buffer
	}{{OutDX, w.DX}, {OutDW, w.DW}} {
		if o.b != nil {
			h.tensors[tensorKey{o.name, o.b.DType()}].Inc()
		}
	}
}

// each3 runs f for the three inputs at once, as an errgroup does (the
// first error cancels the others' context and is returned), with input 0
// on the calling goroutine and inputs 1 and 2 on helper goroutines kept
// between jobs (helpers), whose stacks have already grown to what a Head
// or Fetch needs: a fresh goroutine grows its stack twice on the way down
// to the socket, and each growth copies and walks every frame.
func each3(ctx context.Context, f func(ctx context.Context, i int) error) error {
	gctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	fail := func(err error) {
		once.Do(func() {
			first = err
			cancel(err)
		})
	}
	// A panic in any input, on a helper or on this goroutine, cancels the
	// others and is raised again here only after they end: the caller's
	// deferred releases must not hand a buffer back to the pool while a
	// helper still reads into it. Raised here, it reaches asynq's recovery
	// (see ProcessTask) instead of ending the process.
	var panicked atomic.Pointer[jobPanic]
	run := func(i int) {
		defer func() {
			if x := recover(); x != nil {
				p := newJobPanic(x)
				panicked.CompareAndSwap(nil, p)
				fail(p)
			}
		}()
		if err := f(gctx, i); err != nil {
			fail(err)
		}
	}
	wg.Add(2)
	for i := 1; i <= 2; i++ {
		helperPool.Go(func() {
			defer wg.Done()
			run(i)
		})
	}
	run(0)
	wg.Wait()
	if p := panicked.Load(); p != nil {
		panic(p)
	}
	return first
}

// helperPool runs the jobs (ProcessTask) and their input reads (each3) on
// goroutines kept between jobs, whose stacks have grown already. One pool
// serves every Handler of the process; 256 covers the default 64 handlers'
// three goroutines each.
var helperPool = stackgrow.NewPool(256)

// adopt returns a buffer of dtype dt that is t's bytes as held by its
// header read (t.Local), when the backend and the store can hand them
// over, or nil: the caller then allocates and fetches. The size is checked
// already.
func (h *Handler) adopt(t TensorInfo, dt compute.DType, shape []int) compute.Buffer {
	if !t.Local || h.taker == nil {
		return nil
	}
	data, release, ok := h.taker.TakeInline(t)
	if !ok {
		return nil
	}
	b, ok := h.adopter.Adopt(dt, shape, data, release)
	if !ok {
		// Unsuitable memory (alignment): copy it out, as Fetch would.
		b, err := h.cfg.Backend.Alloc(dt, shape...)
		if err != nil {
			release()
			return nil
		}
		copy(b.Bytes(), data)
		release()
		return b
	}
	return b
}

// checkPin checks that w's bytes, just read, hash to the job's w_sha256,
// and keeps them for the jobs that pin the same w.
func (h *Handler) checkPin(id string, j *Job, t TensorInfo, data []byte) error {
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != j.WSHA256 {
		h.pinMismatch.Inc()
		return jobErr(id, "w", j.W, fmt.Errorf("%w: its %d data bytes (%s %v) hash to %s, the job pins %s (w was replaced after the job was posted, or the pin is wrong)",
			ErrPinMismatch, len(data), t.DType, t.Shape, got, j.WSHA256))
	}
	h.cfg.Pins.put(j.W, j.WSHA256, t.DType, t.Shape, data)
	return nil
}

// seq3 runs f for the three inputs one after another, stopping at the
// first error; each3's contract for work that makes no requests.
func seq3(ctx context.Context, f func(ctx context.Context, i int) error) error {
	for i := range 3 {
		if err := f(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// resultWait bounds how long a finished job keeps trying to write its
// result while Redis is unreachable. asynq v0.26.0 cannot record a task's
// end once Redis failed when the handler returned (its syncer retries under
// a context that is already canceled), so giving up at once sends the job
// through lease expiry and the recoverer: a re-run 1-2 minutes later.
// Waiting out a short Redis restart completes it in place
// (faults.TestRedisRestart). It stays under asynq's 30 s lease, which the
// heartbeat cannot extend while Redis is down.
const resultWait = 20 * time.Second

// writeResult writes b with rw, retrying with backoff for up to resultWait.
func writeResult(ctx context.Context, rw *asynq.ResultWriter, b []byte) error {
	deadline := time.Now().Add(resultWait)
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		_, err := rw.Write(b)
		if err == nil || time.Now().Add(delay).After(deadline) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// checkShapes enforces w = [D], dy = x's shape, a computed dtype
// (compute.DTypes) for each input and the element limit, and returns rows
// (the product of x's leading dims) and D.
func (h *Handler) checkShapes(id string, in [3]TensorInfo) (rows, dim int, err error) {
	for i, t := range in {
		if !compute.DType(t.DType).Valid() {
			return 0, 0, jobErr(id, inputNames[i], t.URI, fmt.Errorf("%w: dtype %s (supported: F32, BF16, F16)", storage.ErrDType, t.DType))
		}
	}
	x, w, dy := in[0], in[1], in[2]
	if len(x.Shape) == 0 {
		return 0, 0, jobErr(id, "x", x.URI, shapeErr("shape %v: want at least one dim [..., D]", x.Shape))
	}
	dim = x.Shape[len(x.Shape)-1]
	n := compute.NumElements(x.Shape)
	if dim <= 0 || n <= 0 {
		return 0, 0, jobErr(id, "x", x.URI, shapeErr("shape %v: every dim must be > 0", x.Shape))
	}
	if int64(n) > h.cfg.Limits.MaxElements {
		return 0, 0, jobErr(id, "x", x.URI, limitErr("shape %v has %d elements, limit (limits.max_elements) is %d", x.Shape, n, h.cfg.Limits.MaxElements))
	}
	if len(w.Shape) != 1 || w.Shape[0] != dim {
		return 0, 0, jobErr(id, "w", w.URI, shapeErr("shape %v: want [%d] (x's last dim; x is %v)", w.Shape, dim, x.Shape))
	}
	if !slices.Equal(dy.Shape, x.Shape) {
		return 0, 0, jobErr(id, "dy", dy.URI, shapeErr("shape %v: want x's shape %v", dy.Shape, x.Shape))
	}
	return n / dim, dim, nil
}

// checkRowScale guards against the one overflow checkFinite cannot see:
// rms_inv = 1/sqrt(mean(x^2)+eps) is > 0 for any finite row, but when a
// row's sum of squares overflows float32 (|x| around 1e19 and up) it comes
// out 0, and dx and dw come out as finite zeros, silently wrong. Such a job
// fails permanently, naming the row.
func checkRowScale(r []float32) error {
	for i, v := range r {
		if v == 0 || math.Float32bits(v)&0x7f800000 == 0x7f800000 {
			return fmt.Errorf("%w: row %d of x: its sum of squares overflows float32 (rms_inv came out %v); rescale x", ErrNonFinite, i, v)
		}
	}
	return nil
}

// checkFinite returns an ErrNonFinite error with the count and the first
// index of NaN/Inf values in v, or nil.
func checkFinite(v []float32) error {
	if allFinite(v) {
		return nil
	}
	first, count := -1, 0
	for i, f := range v {
		// Exponent all ones is Inf or NaN; cheaper than two math calls.
		if math.Float32bits(f)&0x7f800000 == 0x7f800000 {
			if first < 0 {
				first = i
			}
			count++
		}
	}
	if count == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d NaN/Inf of %d values, first at flat index %d (%v)", ErrNonFinite, count, len(v), first, v[first])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
