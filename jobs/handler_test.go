package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/internal/stackgrow"
	"github.com/rmsgrad/rmsgrad/internal/syncbuf"
	"github.com/rmsgrad/rmsgrad/storage"
)

// putInputs stores random x [rows, dim] (or shape when given), w [dim], dy.
func putInputs(s *memStore, prefix string, seed uint64, shape []int) {
	rng := rand.New(rand.NewPCG(seed, 3))
	n := 1
	for _, d := range shape {
		n *= d
	}
	dim := shape[len(shape)-1]
	gen := func(k int) []float32 {
		v := make([]float32, k)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	s.put(prefix+"/x", shape, gen(n))
	s.put(prefix+"/w", []int{dim}, gen(dim))
	s.put(prefix+"/dy", shape, gen(n))
}

func testJob(prefix string) Job {
	return Job{V: 1, X: prefix + "/x", W: prefix + "/w", DY: prefix + "/dy", Out: prefix + "/out", Eps: 1e-6}
}

func payload(t *testing.T, j Job) []byte {
	t.Helper()
	b, err := j.Payload()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type handlerEnv struct {
	h     *Handler
	store *memStore
	be    *refBackend
	b     *Batcher
}

func newHandlerEnv(t *testing.T, limits Limits, budget int64, key []byte) *handlerEnv {
	t.Helper()
	be := &refBackend{}
	st := newMemStore("mem://ok/")
	b := NewBatcher(be, BatchConfig{MaxJobs: 8, MaxWait: time.Millisecond}, nil, nil)
	t.Cleanup(func() { b.Close(context.Background()) })
	h, err := NewHandler(HandlerConfig{Backend: be, Batcher: b, Store: st, Budget: NewBudget(budget), Limits: limits, SigningKey: key, Worker: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return &handlerEnv{h: h, store: st, be: be, b: b}
}

func TestHandlerComputesAndStores(t *testing.T) {
	e := newHandlerEnv(t, Limits{}, 1<<30, nil)
	putInputs(e.store, "mem://ok/a", 1, []int{2, 3, 48})
	j := testJob("mem://ok/a")
	j.Outputs = []string{"r", "dx", "dw"}
	res, err := e.h.process(context.Background(), "id1", payload(t, j), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != 6 || res.Dim != 48 || res.BatchJobs != 1 || res.BatchID == "" || len(res.SHA256) != 3 {
		t.Fatalf("result %+v", res)
	}
	for _, o := range e.store.outs[j.Out] {
		want := map[string]string{"dx": "[2 3 48]", "dw": "[48]", "r": "[6]"}[o.Name]
		if got := fmt.Sprint(o.Shape); got != want {
			t.Fatalf("output %s shape %s, want %s", o.Name, got, want)
		}
	}
	// The stored bytes are the oracle's.
	w := &Work{Rows: 6, Dim: 48, Eps: 1e-6}
	w.X, _ = e.be.Alloc("F32", 6, 48)
	w.W, _ = e.be.Alloc("F32", 48)
	w.DY, _ = e.be.Alloc("F32", 6, 48)
	w.R, _ = e.be.Alloc("F32", 6)
	w.DX, _ = e.be.Alloc("F32", 6, 48)
	w.DW, _ = e.be.Alloc("F32", 48)
	copy(w.X.Bytes(), e.store.tensors[j.X].data)
	copy(w.W.Bytes(), e.store.tensors[j.W].data)
	copy(w.DY.Bytes(), e.store.tensors[j.DY].data)
	copy(w.DX.Float32s(), e.store.output(j.Out, "dx"))
	copy(w.DW.Float32s(), e.store.output(j.Out, "dw"))
	copy(w.R.Float32s(), e.store.output(j.Out, "r"))
	checkOracle(t, w)
	if e.h.cfg.Budget.InUse() != 0 {
		t.Fatalf("budget not released: %d in use", e.h.cfg.Budget.InUse())
	}
}

func TestHandlerPermanentErrors(t *testing.T) {
	key := []byte("k")
	cases := []struct {
		name   string
		setup  func(s *memStore, j *Job)
		limits Limits
		budget int64
		sign   bool
		want   []string // substrings of the message
		is     error
	}{
		{name: "dy shape", setup: func(s *memStore, j *Job) { s.put(j.DY, []int{4, 31}, make([]float32, 124)) },
			want: []string{"tensor dy", "mem://ok/j/dy", "want x's shape [4 32]"}, is: ErrInvalidJob},
		{name: "w shape", setup: func(s *memStore, j *Job) { s.put(j.W, []int{31}, make([]float32, 31)) },
			want: []string{"tensor w", "want [32]"}, is: ErrInvalidJob},
		{name: "missing object", setup: func(s *memStore, j *Job) { j.X = "mem://ok/nope" },
			want: []string{"tensor x", "mem://ok/nope", "not found"}, is: storage.ErrNotFound},
		{name: "dtype disagrees with size", setup: func(s *memStore, j *Job) {
			t := s.tensors[j.W]
			t.dtype = "F16"
			s.tensors[j.W] = t
		}, want: []string{"tensor w", "128 data bytes", "shape [32] of F16 needs 64"}, is: storage.ErrFormat},
		{name: "F64", setup: func(s *memStore, j *Job) {
			s.tensors[j.W] = memTensor{dtype: "F64", shape: []int{32}, data: make([]byte, 8*32)}
		}, want: []string{"tensor w", "dtype F64", "supported: F32, BF16, F16"}, is: storage.ErrDType},
		{name: "bad grad_dtype", setup: func(s *memStore, j *Job) { j.GradDType = "bf16" },
			want: []string{"grad_dtype", `"bf16"`, "F32, BF16, F16"}, is: ErrInvalidJob},
		{name: "max job bytes in bf16", setup: func(s *memStore, j *Job) {
			s.putAs(j.X, compute.BF16, []int{4, 32}, make([]float32, 128))
			s.putAs(j.DY, compute.BF16, []int{4, 32}, make([]float32, 128))
		}, limits: Limits{MaxBytes: 1000},
			// x, dy, dx 2*128 each, w and dw 4*32, r 4*4: 1040.
			want: []string{"needs 1040 buffer bytes", "x [4 32] BF16", "dx BF16, dw F32"}, is: ErrLimit},
		{name: "not allowed", setup: func(s *memStore, j *Job) { j.Out = "mem://other/out" },
			want: []string{"tensor out", "mem://other/out", "not allowed"}, is: storage.ErrNotAllowed},
		{name: "NaN input", setup: func(s *memStore, j *Job) {
			v := make([]float32, 128)
			v[5], v[9] = float32(math.NaN()), float32(math.Inf(1))
			s.put(j.X, []int{4, 32}, v)
		}, want: []string{"tensor x", "2 NaN/Inf of 128", "first at flat index 5"}, is: ErrNonFinite},
		{name: "max elements", limits: Limits{MaxElements: 100},
			want: []string{"tensor x", "128 elements", "limits.max_elements) is 100"}, is: ErrLimit},
		{name: "max job bytes", limits: Limits{MaxBytes: 1000},
			want: []string{"tensor x", "needs 1808 buffer bytes", "is 1000"}, is: ErrLimit},
		{name: "never fits budget", budget: 1500,
			want: []string{"needs 1808 bytes", "budget (budget_bytes, RMSGRAD_BUDGET_BYTES) is 1500"}, is: ErrNeverFits},
		{name: "unsigned", sign: true, want: []string{"unsigned"}, is: ErrBadSignature},
		{name: "out is input", setup: func(s *memStore, j *Job) { j.Out = j.X }, want: []string{"overwrite an input"}, is: ErrInvalidJob},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			budget := c.budget
			if budget == 0 {
				budget = 1 << 30
			}
			var k []byte
			if c.sign {
				k = key
			}
			e := newHandlerEnv(t, c.limits, budget, k)
			putInputs(e.store, "mem://ok/j", 1, []int{4, 32})
			j := testJob("mem://ok/j")
			if c.setup != nil {
				c.setup(e.store, &j)
			}
			err := e.h.ProcessTask(context.Background(), asynq.NewTask(TaskType, payload(t, j)))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, asynq.SkipRetry) {
				t.Fatalf("%v: not permanent (no asynq.SkipRetry)", err)
			}
			if !errors.Is(err, c.is) {
				t.Fatalf("%v: does not match %v", err, c.is)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("message %q lacks %q", err, w)
				}
			}
			if len(e.be.batchSizes()) != 0 {
				t.Fatal("a rejected job reached the device")
			}
			if e.h.cfg.Budget.InUse() != 0 {
				t.Fatal("budget not released")
			}
		})
	}
}

func TestHandlerSignedJob(t *testing.T) {
	key := []byte("secret")
	e := newHandlerEnv(t, Limits{}, 1<<30, key)
	putInputs(e.store, "mem://ok/s", 1, []int{2, 8})
	j := testJob("mem://ok/s")
	if err := j.Sign(key); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.process(context.Background(), "s", payload(t, j), nil); err != nil {
		t.Fatalf("signed job: %v", err)
	}
	j.Eps = 1e-5 // tampered after signing
	_, err := e.h.process(context.Background(), "s", payload(t, j), nil)
	if !errors.Is(err, ErrBadSignature) || !errors.Is(err, asynq.SkipRetry) {
		t.Fatalf("tampered job: %v", err)
	}
}

func TestHandlerTransientStorageErrorRetries(t *testing.T) {
	e := newHandlerEnv(t, Limits{}, 1<<30, nil)
	putInputs(e.store, "mem://ok/t", 1, []int{2, 8})
	e.store.headErr = func(uri string) error {
		if strings.HasSuffix(uri, "/dy") {
			return fmt.Errorf("head %s: connection reset", uri)
		}
		return nil
	}
	err := e.h.ProcessTask(context.Background(), asynq.NewTask(TaskType, payload(t, testJob("mem://ok/t"))))
	if err == nil || errors.Is(err, asynq.SkipRetry) {
		t.Fatalf("transient storage error = %v, want a retryable error", err)
	}
	if !strings.Contains(err.Error(), "tensor dy") {
		t.Fatalf("message %q does not name the tensor", err)
	}
}

func TestHandlerNonFiniteOutputIsPermanent(t *testing.T) {
	e := newHandlerEnv(t, Limits{}, 1<<30, nil)
	// Finite inputs whose dw overflows float32: 2 rows of 3e38*1.
	big := []float32{3e38, 3e38}
	e.store.put("mem://ok/o/x", []int{2, 1}, []float32{1, 1})
	e.store.put("mem://ok/o/w", []int{1}, []float32{1})
	e.store.put("mem://ok/o/dy", []int{2, 1}, big)
	_, err := e.h.process(context.Background(), "o", payload(t, testJob("mem://ok/o")), nil)
	if !errors.Is(err, ErrNonFinite) || !errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), "tensor dw") {
		t.Fatalf("overflowing output: %v, want a permanent non-finite error naming dw", err)
	}
	if _, ok := e.store.outs["mem://ok/o/out"]; ok {
		t.Fatal("a non-finite output was stored")
	}
}

func TestResultJSON(t *testing.T) {
	e := newHandlerEnv(t, Limits{}, 1<<30, nil)
	putInputs(e.store, "mem://ok/r", 2, []int{3, 16})
	res, err := e.h.process(context.Background(), "r", payload(t, testJob("mem://ok/r")), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(res)
	for _, k := range []string{`"out"`, `"sha256"`, `"rows":3`, `"dim":16`, `"backend":"ref"`, `"worker":"test"`, `"batch_id"`, `"batch_jobs":1`, `"timings_ms"`} {
		if !strings.Contains(string(b), k) {
			t.Fatalf("result %s lacks %s", b, k)
		}
	}
}

// TestBatchHashesOutputs: the batcher hashes the outputs of a batch's
// small jobs (two at a time, and a job left over alone) and the store gets
// digests that are the data's (memStore.Write checks each); a job whose
// outputs exceed pairHashMax is left to the store to hash.
func TestBatchHashesOutputs(t *testing.T) {
	be := &refBackend{}
	st := newMemStore("mem://ok/")
	const small = 5
	b := NewBatcher(be, BatchConfig{MaxJobs: small + 1, MaxWait: 5 * time.Second}, nil, nil)
	t.Cleanup(func() { b.Close(context.Background()) })
	h, err := NewHandler(HandlerConfig{Backend: be, Batcher: b, Store: st, Budget: NewBudget(1 << 30), Worker: "test"})
	if err != nil {
		t.Fatal(err)
	}
	type out struct {
		res *Result
		err error
	}
	results := make(chan out, small+1)
	for i := range small + 1 {
		shape := []int{3 + i, 40} // different sizes: pairs of unequal lengths too
		if i == small {
			shape = []int{300, 1024} // dx 1.2 MB: over pairHashMax
		}
		prefix := fmt.Sprintf("mem://ok/j%d", i)
		putInputs(st, prefix, uint64(i), shape)
		j := testJob(prefix)
		j.Outputs = []string{"r", "dx", "dw"}
		go func() {
			res, err := h.process(context.Background(), fmt.Sprint("id", i), payload(t, j), nil)
			results <- out{res, err}
		}()
	}
	for range small + 1 {
		o := <-results
		if o.err != nil {
			t.Fatal(o.err)
		}
		if o.res.BatchJobs != small+1 {
			t.Fatalf("batch of %d jobs, want all %d in one", o.res.BatchJobs, small+1)
		}
	}
	if n := st.presummed.Load(); n != 3*small {
		t.Fatalf("%d outputs came with the batcher's digest, want %d (3 for each small job, none for the large one)", n, 3*small)
	}
}

// newObservedHandlerEnv is newHandlerEnv whose handler counts into a
// registry of its own and logs JSON into a buffer, both returned.
func newObservedHandlerEnv(t *testing.T) (*handlerEnv, *prometheus.Registry, *syncbuf.Buffer) {
	t.Helper()
	e := newHandlerEnv(t, Limits{}, 1<<30, nil)
	reg := prometheus.NewRegistry()
	logs := &syncbuf.Buffer{}
	h, err := NewHandler(HandlerConfig{Backend: e.be, Batcher: e.b, Store: e.store, Budget: NewBudget(1 << 30), Worker: "test",
		Metrics: NewMetrics(reg), Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.h = h
	return e, reg, logs
}

// TestProcessTaskBackendPanic: a panic in the compute backend reaches the
// job as its error, not as a panic: the job fails with outcome="panic", is
// logged at error with a retry ahead, and the worker's next job completes.
func TestProcessTaskBackendPanic(t *testing.T) {
	e, reg, logs := newObservedHandlerEnv(t)
	h := e.h
	putInputs(e.store, "mem://ok/bp", 1, []int{8, 64})
	task := asynq.NewTask(TaskType, payload(t, testJob("mem://ok/bp")))
	e.be.fail = func([]compute.Op) error { panic("planted kernel host bug") }
	err := h.ProcessTask(context.Background(), task)
	var p *BackendPanic
	if !errors.As(err, &p) || IsPermanent(err) || !strings.Contains(err.Error(), "planted kernel host bug") {
		t.Fatalf("ProcessTask = %v, want a retryable *BackendPanic naming the panic", err)
	}
	if n := counter(t, reg, "rmsgrad_jobs_total", map[string]string{"outcome": OutcomePanic}); n != 1 {
		t.Errorf("rmsgrad_jobs_total{outcome=panic} = %v, want 1", n)
	}
	if !strings.Contains(logs.String(), `"level":"ERROR","msg":"job failed: the compute backend panicked; will retry"`) {
		t.Errorf("no error line for the job:\n%s", logs.String())
	}
	e.be.fail = nil
	if err := h.ProcessTask(context.Background(), task); err != nil {
		t.Fatalf("the job after the panic: %v", err)
	}
}

// TestEach3: each input runs once; the first error cancels the others'
// context (with it as the cause) and is returned after all three end; the
// helpers are reused across calls (at most two busy per call here).
func TestEach3(t *testing.T) {
	before := int32(helperPool.Len())
	for range 50 {
		var calls [3]atomic.Int32
		if err := each3(context.Background(), func(ctx context.Context, i int) error {
			calls[i].Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for i := range calls {
			if n := calls[i].Load(); n != 1 {
				t.Fatalf("input %d ran %d times", i, n)
			}
		}
		time.Sleep(2 * time.Millisecond) // the helpers park again
	}
	// Without reuse the 50 calls start 100 helpers (up to max); a loaded
	// machine may not park a helper within the pause now and then, so the
	// bound is half of that.
	if n := int32(helperPool.Len()) - before; n >= 50 {
		t.Errorf("%d new helpers for 50 calls one after another: they are not reused", n)
	}
	boom := errors.New("input 1 failed")
	var sawCancel atomic.Int32
	err := each3(context.Background(), func(ctx context.Context, i int) error {
		if i == 1 {
			return boom
		}
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), boom) {
				sawCancel.Add(1)
			}
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("not cancelled")
		}
	})
	if !errors.Is(err, boom) || sawCancel.Load() != 2 {
		t.Fatalf("each3 = %v, %d of 2 others saw the cancel with its cause", err, sawCancel.Load())
	}
}

// TestEach3PanicWaits: a panic in any input, the caller's own (input 0)
// included, cancels the others and is raised only after they end: the job's
// deferred releases must not hand a buffer back to the pool while a helper
// still reads into it. The panic carries the stack where it happened.
func TestEach3PanicWaits(t *testing.T) {
	for _, bad := range []int{0, 1, 2} {
		var running atomic.Int32
		var got any
		func() {
			defer func() { got = recover() }()
			_ = each3(context.Background(), func(ctx context.Context, i int) error {
				if i == bad {
					panic(fmt.Sprintf("planted panic in input %d", i))
				}
				running.Add(1)
				defer running.Add(-1)
				<-ctx.Done()
				time.Sleep(20 * time.Millisecond) // still writing a buffer after the cancel
				return ctx.Err()
			})
		}()
		p, ok := got.(*jobPanic)
		if !ok {
			t.Fatalf("input %d: each3 raised %T %v, want a *jobPanic", bad, got, got)
		}
		if n := running.Load(); n != 0 {
			t.Fatalf("input %d panicked: each3 raised it while %d other inputs still ran", bad, n)
		}
		if msg := p.Error(); !strings.Contains(msg, fmt.Sprintf("planted panic in input %d", bad)) || !strings.Contains(msg, "TestEach3PanicWaits") {
			t.Fatalf("input %d: the panic's message lacks its value or the stack where it happened:\n%s", bad, msg)
		}
	}
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// stackAfter is the stack a fresh goroutine holds after running f once
// (GC off, so stacks are not shrunk; the goroutines stay parked while
// StackInuse is read), averaged over 128 goroutines. StackInuse counts
// whole stack spans, so the average is close, not exact.
func stackAfter(t *testing.T, f func()) float64 {
	t.Helper()
	const n = 128
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	done, release := make(chan struct{}), make(chan struct{})
	var exited sync.WaitGroup
	for range n {
		exited.Add(1)
		go func() {
			defer exited.Done()
			f()
			done <- struct{}{}
			<-release
		}()
		<-done
	}
	runtime.ReadMemStats(&after)
	close(release)
	exited.Wait() // their stacks are not freed under the next measurement
	return float64(int64(after.StackInuse)-int64(before.StackInuse)) / n
}

// TestGrowStack: stackgrow.Grow takes a fresh goroutine's stack to 16 KiB,
// a job's whole path after it (on a helper, which calls Grow) needs no
// more, and ProcessTask, called on a fresh goroutine as asynq calls it,
// leaves that goroutine's stack as it started: the job ran on a helper.
//
// StackInuse is process-wide and counts whole stack spans, which the
// stacks of goroutines that ended earlier (other tests) keep cached, so
// the measuring runs in a process of its own: the test binary again, with
// only this test.
func TestGrowStack(t *testing.T) {
	if os.Getenv("RMSGRAD_STACK_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestGrowStack$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "RMSGRAD_STACK_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestGrowStack")) {
			t.Fatalf("the measuring process: %v\n%s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "stack after") {
				t.Log(strings.TrimSpace(l))
			}
		}
		return
	}
	start := stackAfter(t, func() {})
	grown := stackAfter(t, stackgrow.Grow)
	if grown < 12<<10 {
		t.Fatalf("stackgrow.Grow left %.0f B of stack on average, want about 16 KiB (the compiler dropped its frame?)", grown)
	}
	e := newHandlerEnv(t, Limits{}, 1<<30, nil)
	putInputs(e.store, "mem://ok/g", 1, []int{8, 1024})
	task := asynq.NewTask(TaskType, payload(t, testJob("mem://ok/g")))
	// The same handler, quiet: 128 jobs' log lines are not the test's.
	h, err := NewHandler(HandlerConfig{Backend: e.be, Batcher: e.b, Store: e.store, Budget: NewBudget(1 << 30),
		Worker: "test", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	job := stackAfter(t, func() {
		stackgrow.Grow() // as a helper does before each job
		if err := h.processTask(context.Background(), task); err != nil {
			t.Error(err)
		}
	})
	// Stacks come in powers of two: a path that outgrew 16 KiB would leave
	// 32 KiB. StackInuse is process-wide, so other goroutines' stacks
	// coming and going blur the average by a KiB or two either way: the
	// bound is the midpoint.
	if job > 24<<10 {
		t.Errorf("a job's path after stackgrow.Grow ends with %.0f B of stack on average, more than Grow's 16 KiB: it grew the stack again", job)
	}
	// Through ProcessTask, after one job has started the helpers it needs:
	// the calling goroutine only waits, so its stack stays at the start
	// size (what a goroutine that does nothing holds); a job run on it
	// would at least double it (8 KiB here from 2, with the in-memory
	// store's shallow path).
	if err := h.ProcessTask(context.Background(), task); err != nil {
		t.Fatal(err)
	}
	caller := stackAfter(t, func() {
		if err := h.ProcessTask(context.Background(), task); err != nil {
			t.Error(err)
		}
	})
	if caller > start+1<<10 {
		t.Errorf("ProcessTask's goroutine ends with %.0f B of stack on average, a goroutine that does nothing %.0f B: the job ran on it, not on a helper", caller, start)
	}
	t.Logf("stack after stackgrow.Grow: %.0f B; after a job's path: %.0f B; ProcessTask's caller: %.0f B (start size %.0f B)", grown, job, caller, start)
}

// TestProcessTaskPanic: a panic in a job's path, on the helper that runs
// the job or on one that reads an input, comes out of ProcessTask on the
// caller's goroutine (where asynq recovers it) naming the panic and where it
// happened; the process lives on and the next job runs. Each panic is
// counted under outcome "panic" and logged at error level with its stack.
func TestProcessTaskPanic(t *testing.T) {
	e, reg, logs := newObservedHandlerEnv(t)
	putInputs(e.store, "mem://ok/p", 1, []int{8, 64})
	task := asynq.NewTask(TaskType, payload(t, testJob("mem://ok/p")))
	for _, input := range []string{"x", "dy"} {
		e.store.headErr = func(uri string) error {
			if strings.Contains(uri, "/"+input) {
				panic("planted panic reading " + input)
			}
			return nil
		}
		var got any
		func() {
			defer func() { got = recover() }()
			_ = e.h.ProcessTask(context.Background(), task)
		}()
		p, ok := got.(*jobPanic)
		if !ok {
			t.Fatalf("input %s: ProcessTask raised %T %v, want a *jobPanic", input, got, got)
		}
		if msg := p.Error(); !strings.Contains(msg, "planted panic reading "+input) || !strings.Contains(msg, "TestProcessTaskPanic") {
			t.Fatalf("input %s: the panic's message lacks its value or the stack where it happened:\n%s", input, msg)
		}
	}
	e.store.headErr = nil
	if err := e.h.ProcessTask(context.Background(), task); err != nil {
		t.Fatalf("the job after the panics: %v", err)
	}
	if n := counter(t, reg, "rmsgrad_jobs_total", map[string]string{"outcome": OutcomePanic}); n != 2 {
		t.Errorf("rmsgrad_jobs_total{outcome=panic} = %v after two panics, want 2", n)
	}
	if n := counter(t, reg, "rmsgrad_jobs_total", map[string]string{"outcome": OutcomeOK}); n != 1 {
		t.Errorf("rmsgrad_jobs_total{outcome=ok} = %v after the job that followed, want 1", n)
	}
	var panics int
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct{ Level, Msg, Outcome, Panic, Stack string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec.Msg != "job panicked" {
			continue
		}
		panics++
		if rec.Level != "ERROR" || rec.Outcome != OutcomePanic || !strings.HasPrefix(rec.Panic, "planted panic reading ") || !strings.Contains(rec.Stack, "TestProcessTaskPanic") {
			t.Errorf("panic log line lacks its level, outcome, value or stack: %s", line)
		}
	}
	if panics != 2 {
		t.Errorf("%d \"job panicked\" log lines after two panics, want 2:\n%s", panics, logs.String())
	}
}
