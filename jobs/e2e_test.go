package jobs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
)

// e2eWorker is one worker process's worth of parts on a real Redis.
type e2eWorker struct {
	srv *asynq.Server
	b   *Batcher
}

func startWorker(t *testing.T, redis asynq.RedisConnOpt, be compute.Backend, st Store) *e2eWorker {
	t.Helper()
	b := NewBatcher(be, BatchConfig{MaxJobs: 16, MaxWait: 3 * time.Millisecond}, nil, nil)
	h, err := NewHandler(HandlerConfig{Backend: be, Batcher: b, Store: st, Budget: NewBudget(256 << 20), Worker: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServer(redis, asynq.Config{
		Concurrency:     48,
		Queues:          map[string]int{DefaultQueue: 1},
		RetryDelayFunc:  RetryDelay(50*time.Millisecond, 200*time.Millisecond),
		ShutdownTimeout: 20 * time.Second,
		LogLevel:        asynq.WarnLevel,
	})
	mux := asynq.NewServeMux()
	h.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	return &e2eWorker{srv: srv, b: b}
}

// stop is the worker's SIGTERM path: stop taking jobs and let the active
// handlers finish (asynq Shutdown), then drain the batcher.
func (w *e2eWorker) stop(t *testing.T) {
	w.srv.Shutdown()
	if err := w.b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

type e2eJob struct {
	prefix string
	shape  []int
	id     string
}

func TestEndToEnd(t *testing.T) {
	rs := testenv.Redis(t)
	redis := asynq.RedisClientOpt{Addr: rs.Addr}
	st := newMemStore("mem://ok/")
	// The real CPU backend (compute/cpu): the worker's default.
	var be compute.Backend = cpu.New()
	w := startWorker(t, redis, be, st)
	defer func() {
		if w != nil {
			w.stop(t)
		}
	}()
	client := NewClient(redis, WithMaxRetry(3), WithPollInterval(50*time.Millisecond))
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rng := rand.New(rand.NewPCG(42, 1))
	dims := []int{1, 7, 64, 129, 256, 512}
	const n = 500
	good := make([]e2eJob, n)
	for i := range good {
		shape := []int{1 + rng.IntN(24), dims[rng.IntN(len(dims))]}
		if i%5 == 0 {
			shape = []int{1 + rng.IntN(3), 1 + rng.IntN(5), shape[1]} // [batch, seq, D]
		}
		good[i] = e2eJob{prefix: fmt.Sprintf("mem://ok/g%d", i), shape: shape}
		putInputs(st, good[i].prefix, uint64(i), shape)
	}
	// Bad jobs mixed in: each must end archived with its message while
	// its batch-mates complete.
	type badJob struct {
		j    Job
		want string
		id   string
	}
	var bad []*badJob
	for i := 0; i < 5; i++ {
		p := fmt.Sprintf("mem://ok/b%d", i)
		putInputs(st, p, uint64(1000+i), []int{4, 64})
		st.put(p+"/dyw", []int{4, 63}, make([]float32, 252))
		j := testJob(p)
		bad = append(bad,
			&badJob{j: Job{X: j.X, W: j.W, DY: p + "/dyw", Out: j.Out, Eps: 1e-6}, want: "tensor dy"},
			&badJob{j: Job{X: p + "/missing", W: j.W, DY: j.DY, Out: j.Out, Eps: 1e-6}, want: "not found"},
			&badJob{j: Job{X: j.X, W: j.W, DY: j.DY, Out: "mem://forbidden/out", Eps: 1e-6}, want: "not allowed"},
		)
	}

	// Enqueue good and bad interleaved, half with caller-chosen ids (and a
	// duplicate enqueue of one of them, which must be a no-op).
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	enq := func(j Job, opts ...asynq.Option) string {
		id, err := client.Enqueue(ctx, j, opts...)
		if err != nil {
			t.Error(err)
		}
		return id
	}
	for i := range good {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			j := testJob(good[i].prefix)
			if i%7 == 0 {
				j.Outputs = []string{"dx", "dw", "r"}
			}
			var id string
			if i%2 == 0 {
				id = enq(j, asynq.TaskID(fmt.Sprintf("good-%d", i)))
			} else {
				id = enq(j)
			}
			mu.Lock()
			good[i].id = id
			mu.Unlock()
			if i < len(bad) {
				bad[i].id = enq(bad[i].j)
			}
		})
	}
	wg.Wait()
	// Retrying an enqueue of the same job under its id is a no-op that
	// returns the id; reusing the id for another job is an error.
	first := testJob(good[0].prefix)
	first.Outputs = []string{"r", "dx", "dw"} // same set as enqueued, another order
	if dup := enq(first, asynq.TaskID("good-0")); dup != "good-0" {
		t.Fatalf("duplicate enqueue returned %q", dup)
	}
	if _, err := client.Enqueue(ctx, testJob(good[1].prefix), asynq.TaskID("good-0")); !errors.Is(err, ErrIDReused) || !strings.Contains(err.Error(), "good-0") {
		t.Fatalf("enqueue of another job under id good-0: %v, want ErrIDReused naming the id", err)
	}
	// The same tensors asking for other output dtypes, or pinning w, are
	// other jobs too: their results differ.
	for name, change := range map[string]func(*Job){
		"grad_dtype": func(j *Job) { j.GradDType = "BF16" },
		"w_sha256":   func(j *Job) { j.WSHA256 = strings.Repeat("ab", 32) },
	} {
		other := testJob(good[0].prefix)
		other.Outputs = first.Outputs
		change(&other)
		if _, err := client.Enqueue(ctx, other, asynq.TaskID("good-0")); !errors.Is(err, ErrIDReused) {
			t.Fatalf("enqueue of the job with another %s under id good-0: %v, want ErrIDReused", name, err)
		}
	}

	// Stop the worker mid-load (SIGTERM path) and start a fresh one: no job
	// may be lost.
	time.Sleep(20 * time.Millisecond)
	w.stop(t)
	w = startWorker(t, redis, be, st)

	batchSizes := map[int]int{}
	for i, g := range good {
		res, err := client.Wait(ctx, g.id)
		if err != nil {
			t.Fatalf("good job %d (%v): %v", i, g.shape, err)
		}
		batchSizes[res.BatchJobs]++
		rows := 1
		for _, d := range g.shape[:len(g.shape)-1] {
			rows *= d
		}
		dim := g.shape[len(g.shape)-1]
		if res.Rows != rows || res.Dim != dim || res.Out != g.prefix+"/out" || res.SHA256["dx"] == "" {
			t.Fatalf("good job %d: result %+v", i, res)
		}
		// Oracle, and bitwise equality with a single-job CPU run.
		alone := newWork(t, be, 0, rows, dim)
		copy(alone.X.Bytes(), st.tensors[g.prefix+"/x"].data)
		copy(alone.W.Bytes(), st.tensors[g.prefix+"/w"].data)
		copy(alone.DY.Bytes(), st.tensors[g.prefix+"/dy"].data)
		one := compute1(t, be, alone)
		gotDX, gotDW := st.output(res.Out, "dx"), st.output(res.Out, "dw")
		if !slices.Equal(gotDX, one.DX.Float32s()) || !slices.Equal(gotDW, one.DW.Float32s()) {
			t.Fatalf("good job %d: batched output (batch of %d) differs bitwise from a single-job run", i, res.BatchJobs)
		}
		if i%7 == 0 && !slices.Equal(st.output(res.Out, "r"), one.R.Float32s()) {
			t.Fatalf("good job %d: r differs", i)
		}
		checkOracle(t, one)
	}
	for _, b := range bad {
		_, err := client.Wait(ctx, b.id)
		var fe *JobFailedError
		if !errors.As(err, &fe) {
			t.Fatalf("bad job %s: %v, want a failed job", b.id, err)
		}
		if fe.Retried != 0 || !strings.Contains(fe.Msg, b.want) || !strings.Contains(fe.Msg, "job "+b.id) {
			t.Fatalf("bad job %s: retried %d, message %q, want %q naming the job", b.id, fe.Retried, fe.Msg, b.want)
		}
	}
	multi := 0
	for size, c := range batchSizes {
		if size > 1 {
			multi += c
		}
	}
	if multi == 0 {
		t.Fatalf("no batch of more than one job observed: %v", batchSizes)
	}
	t.Logf("%d good jobs, %d bad jobs archived; jobs by batch size: %v", n, len(bad), batchSizes)
}

// compute1 runs w alone in its own command buffer.
func compute1(t *testing.T, be compute.Backend, w *Work) *Work {
	t.Helper()
	b := NewBatcher(be, BatchConfig{MaxJobs: 1}, nil, nil)
	defer b.Close(context.Background())
	if _, err := b.Submit(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	return w
}
