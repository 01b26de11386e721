package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// feeder enqueues jobs at a steady rate, as orchestrators do, and keeps
// trying a job whose enqueue failed (Redis down): the caller-chosen task id
// makes a retried enqueue safe.
type feeder struct {
	mu       sync.Mutex
	ids      []string // enqueued
	failures int      // enqueue attempts that failed
	lastErr  error
	done     chan struct{}
}

func feed(ctx context.Context, e *Env, prefix string, ins []*Input, n int, every time.Duration) *feeder {
	f := &feeder{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; i < n; {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("%s-%04d", prefix, i)
			in := ins[i%len(ins)]
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := e.Client.Enqueue(actx, in.Job(outURI(id)), taskID(id))
			cancel()
			f.mu.Lock()
			if err != nil {
				f.failures++
				f.lastErr = err
			} else {
				f.ids = append(f.ids, id)
				i++
			}
			f.mu.Unlock()
		}
	}()
	return f
}

func (f *feeder) enqueued() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ids...)
}

func outURI(id string) string { return fmt.Sprintf("s3://%s/out/%s.safetensors", Bucket, id) }

// waitCompleted waits until at least n jobs of the queue completed.
func waitCompleted(t *testing.T, ctx context.Context, e *Env, n int) {
	t.Helper()
	for {
		info, err := e.Insp.GetQueueInfo(jobs.DefaultQueue)
		if err == nil && info.Completed >= n {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("fewer than %d jobs completed: %v", n, ctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// watchReady polls the worker's /readyz every 100 ms until stop closes and
// reports when it first said not ready (with that body) and whether it
// said ready again before back closed (the test closes it as the
// dependency's restart begins), and when /readyz first said ready after
// back closed.
type readyWatch struct {
	firstDown  time.Duration // after start; -1 if never
	downBody   string
	upWhileOut int // 200 answers after the first 503, before back
	upAgain    time.Duration
}

func watchReady(w *Worker, start time.Time, back <-chan struct{}, stop <-chan struct{}) *readyWatch {
	r := &readyWatch{firstDown: -1, upAgain: -1}
	var backAt time.Time
	for {
		select {
		case <-stop:
			return r
		case <-back:
			backAt = time.Now()
			back = nil
		case <-time.After(100 * time.Millisecond):
		}
		code, body, err := w.Readyz()
		if err != nil {
			continue
		}
		switch {
		case code != 200 && r.firstDown < 0:
			r.firstDown, r.downBody = time.Since(start), body
		case code == 200 && r.firstDown >= 0 && backAt.IsZero():
			r.upWhileOut++
		case code == 200 && !backAt.IsZero() && r.upAgain < 0:
			r.upAgain = time.Since(backAt)
		}
	}
}

// The long-outage test compresses time a hundredfold: the worker's retry
// delays (retry_base 1 s, retry_max 5 min by default) become 10 ms and 3 s,
// the store's own retries (storage.s3.backoff: 5 attempts, 100 ms to 5 s)
// become 1 ms to 50 ms, the job keeps the CLI's max_retry of 10, and the
// storage outage of 18 s stands for 30 minutes. With outages counted as
// failures (before jobs.IsFailure), about 11 attempts, some 13 minutes at
// full scale, archive a job.
const (
	outageScale    = 100
	outageFull     = 30 * time.Minute
	outageMaxRetry = 10
)

// TestStorageOutage stops versitygw for the equivalent of 30 minutes of
// retry periods while jobs keep arriving: every job must complete with the
// clean run's outputs, none may be archived or lost, and none may have used
// up a single retry (an outage is not the job's failure: jobs.IsFailure).
// While storage is down, the worker must stop taking new jobs: it holds at
// most its concurrency at the readiness gate (handing each back after
// outage_hold), /readyz reports the outage while it lasts, and the held jobs
// go on once it is back.
func TestStorageOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: an 18 s storage outage")
	}
	t.Parallel()
	e := NewEnv(t)
	e.Client.Close()
	e.Client = jobs.NewClient(asynq.RedisClientOpt{Addr: e.Redis.Addr}, jobs.WithMaxRetry(outageMaxRetry), jobs.WithPollInterval(50*time.Millisecond))
	ins := e.Inputs(t, "so", 21, [2]int{16, 1024}, [2]int{64, 512}, [2]int{8, 4096}, [2]int{32, 256})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const conc = 16
	w := StartWorker(t, workerBin, e, WorkerConfig{Name: "w", Concurrency: conc,
		RetryBase: time.Second / outageScale, RetryMax: 5 * time.Minute / outageScale, OutageHold: 5 * time.Second,
		StoreBackoff: [3]time.Duration{5, 100 * time.Millisecond / outageScale, 5 * time.Second / outageScale}})
	const n = 800
	outage := outageFull / outageScale
	fd := feed(ctx, e, "so", ins, n, 30*time.Millisecond) // 33 jobs/s for 24 s
	waitCompleted(t, ctx, e, 50)

	downAt := time.Now()
	e.S3.Stop()
	back, stop := make(chan struct{}), make(chan struct{})
	var rw *readyWatch
	watched := make(chan struct{})
	go func() { rw = watchReady(w, downAt, back, stop); close(watched) }()
	// While storage is down: how many jobs the worker holds, and how many
	// are active in the queue (taken by a worker), sampled.
	var maxHeld, maxActive float64
	var sawMetric bool
	for time.Since(downAt) < outage {
		time.Sleep(250 * time.Millisecond)
		if m, err := w.Metrics(); err == nil {
			if v, ok := metricValue(m, "rmsgrad_jobs_held"); ok {
				maxHeld = max(maxHeld, v)
			}
			sawMetric = sawMetric || strings.Contains(m, `rmsgrad_dependency_up{dependency="storage"} 0`)
		}
		if info, err := e.Insp.GetQueueInfo(jobs.DefaultQueue); err == nil {
			maxActive = max(maxActive, float64(info.Active))
		}
	}
	pendingAtEnd := 0
	if info, err := e.Insp.GetQueueInfo(jobs.DefaultQueue); err == nil {
		pendingAtEnd = info.Pending + info.Retry
	}
	// back closes as the restart begins: the server may answer (and the
	// worker's probe see it) before Start has seen it serve and returned.
	close(back)
	e.S3.Start()
	if err := w.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("after storage came back: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	<-watched

	<-fd.done
	ids := fd.enqueued()
	if len(ids) != n {
		t.Fatalf("enqueued %d of %d jobs: %v", len(ids), n, fd.lastErr)
	}
	f, err := e.WaitFinal(ctx, ids)
	if err != nil {
		t.Fatalf("%v; lost %v", err, first(f.Lost, 10))
	}
	if len(f.Lost) > 0 || len(f.Archived) > 0 {
		t.Fatalf("%d jobs lost (%v), %d archived (%v)", len(f.Lost), first(f.Lost, 5), len(f.Archived), f.Archived)
	}
	hit := 0
	for i, id := range ids {
		in := ins[i%len(ins)]
		if err := CheckResult(f.Results[id], in, outURI(id)); err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
		if i%10 == 0 {
			if err := e.CheckObject(ctx, in, outURI(id)); err != nil {
				t.Fatalf("job %s: %v", id, err)
			}
		}
		if f.Retried[id] != 0 {
			t.Fatalf("job %s used %d of its %d retries (last error %q): an outage must not count", id, f.Retried[id], outageMaxRetry, f.LastErr[id])
		}
		if f.LastErr[id] != "" {
			hit++
		}
	}
	m, err := w.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	outages, _ := metricValue(m, `rmsgrad_jobs_total{outcome="outage"}`)
	held, _ := metricValue(m, `rmsgrad_jobs_total{outcome="held"}`)
	if hit == 0 || outages+held == 0 {
		t.Fatalf("no job met the outage (%d with a last error, %.0f outage and %.0f held outcomes)", hit, outages, held)
	}
	// Stopped taking jobs: at most its concurrency active at once, jobs
	// held at the gate, and the jobs that arrived during the outage waiting
	// in the queue instead of running into errors.
	if maxActive > conc || maxHeld < 1 || pendingAtEnd < 100 {
		t.Fatalf("during the outage: up to %.0f jobs active (concurrency %d), up to %.0f held at the gate, %d waiting in the queue at its end: the worker did not stop taking jobs", maxActive, conc, maxHeld, pendingAtEnd)
	}
	// Runs into the outage are bounded by what was in flight when it
	// began and what the worker took before its probe saw it (about a
	// second, at most its concurrency); without the gate every job would
	// fail again every few retry periods.
	if outages > 4*conc {
		t.Fatalf("%.0f job runs ended in the outage, want at most %d: the gate did not hold jobs", outages, 4*conc)
	}
	if rw.firstDown < 0 || rw.firstDown > 5*time.Second || !strings.Contains(rw.downBody, "storage") {
		t.Fatalf("/readyz during the outage: first not-ready after %v (want within 5 s), body %q", rw.firstDown, rw.downBody)
	}
	if rw.upWhileOut > 0 {
		t.Fatalf("/readyz said ready %d times while storage was down", rw.upWhileOut)
	}
	if !sawMetric {
		t.Fatal(`/metrics lacked rmsgrad_dependency_up{dependency="storage"} 0 during the outage`)
	}
	if w.Exited() {
		t.Fatalf("worker exited: %v", w.Wait())
	}
	if err := w.Term(60 * time.Second); err != nil {
		t.Fatalf("worker after SIGTERM: %v", err)
	}
	t.Logf("FIGURE storage-outage jobs=%d lost=%d archived=%d max_retried=0 met_outage=%d outage_runs=%.0f held_handbacks=%.0f max_held=%.0f max_active=%.0f queued_at_end=%d outage_s=%.0f equivalent_min=%.0f max_retry=%d readyz_down_after_s=%.1f readyz_up_after_s=%.1f",
		len(ids), len(f.Lost), len(f.Archived), hit, outages, held, maxHeld, maxActive, pendingAtEnd, outage.Seconds(), outageFull.Minutes(), outageMaxRetry, rw.firstDown.Seconds(), rw.upAgain.Seconds())
}

// metricValue returns the value of the first sample of name (with its
// labels, as /metrics writes them) in a /metrics text.
func metricValue(text, name string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// TestRedisRestart takes redis-server down for 8 s while jobs keep
// arriving, with the persistence the README asks of a fleet (AOF on,
// appendfsync everysec): once stopped cleanly (SIGTERM) and once crashed
// (SIGKILL; Redis writes the AOF before it answers, so a process crash
// loses nothing acknowledged, only a machine crash can lose up to 1 s).
// The worker must stay up, /readyz must name Redis while it is down, the
// enqueue CLI must fail at once with a message naming Redis and its
// address, and after the restart every job must complete with the clean
// run's outputs.
func TestRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: an 8 s Redis outage")
	}
	t.Parallel()
	t.Run("sigterm", func(t *testing.T) { t.Parallel(); redisOutage(t, false) })
	t.Run("sigkill", func(t *testing.T) { t.Parallel(); redisOutage(t, true) })
}

func redisOutage(t *testing.T, crash bool) {
	e := NewEnv(t, "--appendonly", "yes", "--appendfsync", "everysec")
	ins := e.Inputs(t, "rr", 31, [2]int{16, 1024}, [2]int{64, 512}, [2]int{8, 4096}, [2]int{32, 256})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := StartWorker(t, workerBin, e, WorkerConfig{Name: "w", RetryBase: 500 * time.Millisecond, RetryMax: 4 * time.Second})
	const n, outage = 500, 8 * time.Second
	fd := feed(ctx, e, "rr", ins, n, 30*time.Millisecond)
	waitCompleted(t, ctx, e, 50)

	downAt := time.Now()
	mode := "sigterm"
	if crash {
		mode = "sigkill"
		e.Redis.Kill()
	} else {
		e.Redis.Stop()
	}
	back, stop := make(chan struct{}), make(chan struct{})
	var rw *readyWatch
	watched := make(chan struct{})
	go func() { rw = watchReady(w, downAt, back, stop); close(watched) }()

	// The CLI while Redis is down: a clear error, at once.
	time.Sleep(time.Second)
	cliStart := time.Now()
	cli := exec.CommandContext(ctx, enqueueBin, "submit", "--redis", e.Redis.Addr,
		"--x", ins[0].X, "--w", ins[0].W, "--dy", ins[0].DY, "--out", outURI("cli"))
	cli.Dir = t.TempDir()
	cli.Env = cleanEnv()
	var stderr bytes.Buffer
	cli.Stderr = &stderr
	cliErr := cli.Run()
	cliTook := time.Since(cliStart)
	var ee *exec.ExitError
	if !errors.As(cliErr, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("enqueue submit with Redis down: %v (want a non-zero exit); stderr %q", cliErr, stderr.String())
	}
	msg := strings.TrimSpace(stderr.String())
	if !strings.Contains(msg, e.Redis.Addr) || !strings.Contains(strings.ToLower(msg), "redis") || cliTook > 15*time.Second {
		t.Fatalf("enqueue submit with Redis down took %v and said %q: want a message naming Redis and %s within 15 s", cliTook, msg, e.Redis.Addr)
	}
	t.Logf("enqueue CLI with Redis down (exit %d after %v): %s", ee.ExitCode(), cliTook.Round(time.Millisecond), msg)

	time.Sleep(outage - time.Since(downAt))
	close(back) // as the restart begins, as in TestStorageOutage
	e.Redis.Start()
	backAt := time.Now()
	if err := w.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("after Redis came back: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	<-watched

	<-fd.done
	ids := fd.enqueued()
	if len(ids) != n {
		t.Fatalf("enqueued %d of %d jobs: %v", len(ids), n, fd.lastErr)
	}
	f, err := e.WaitFinal(ctx, ids)
	if err != nil {
		t.Fatalf("%v; lost %v", err, first(f.Lost, 10))
	}
	recovered := time.Since(backAt)
	if len(f.Lost) > 0 || len(f.Archived) > 0 {
		t.Fatalf("%d jobs lost (%v), %d archived (%v)", len(f.Lost), first(f.Lost, 5), len(f.Archived), f.Archived)
	}
	leaseExpired := 0
	for i, id := range ids {
		in := ins[i%len(ins)]
		if err := CheckResult(f.Results[id], in, outURI(id)); err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
		if i%10 == 0 {
			if err := e.CheckObject(ctx, in, outURI(id)); err != nil {
				t.Fatalf("job %s: %v", id, err)
			}
		}
		if strings.Contains(f.LastErr[id], "lease expired") {
			leaseExpired++
		}
	}
	// Jobs that finished while Redis was down wait to write their result
	// (jobs.resultWait) instead of going through lease expiry: before that,
	// 19 of 500 jobs here came back only through asynq's recoverer, 110 s
	// after the restart. One may still: a dequeue whose reply Redis never
	// sent as it shut down.
	if leaseExpired > 1 {
		t.Fatalf("%d jobs were re-run after their lease expired, want at most 1", leaseExpired)
	}
	if rw.firstDown < 0 || rw.firstDown > 5*time.Second || !strings.Contains(rw.downBody, "redis") {
		t.Fatalf("/readyz during the outage: first not-ready after %v (want within 5 s), body %q", rw.firstDown, rw.downBody)
	}
	if rw.upWhileOut > 0 {
		t.Fatalf("/readyz said ready %d times while Redis was down", rw.upWhileOut)
	}
	if w.Exited() {
		t.Fatalf("worker exited during the Redis outage: %v\n%s", w.Wait(), tail(w.Logs()))
	}
	if err := w.Term(60 * time.Second); err != nil {
		t.Fatalf("worker after SIGTERM: %v", err)
	}
	fd.mu.Lock()
	failures := fd.failures
	fd.mu.Unlock()
	retried := 0
	for _, id := range ids {
		if f.Retried[id] > 0 {
			retried++
		}
	}
	t.Logf("FIGURE redis-restart mode=%s jobs=%d lost=%d archived=%d retried=%d lease_recovered=%d enqueue_failures_while_down=%d outage_s=%.0f readyz_down_after_s=%.1f readyz_up_after_s=%.1f cli_fail_s=%.2f all_done_after_restart_s=%.1f",
		mode, len(ids), len(f.Lost), len(f.Archived), retried, leaseExpired, failures, outage.Seconds(), rw.firstDown.Seconds(), rw.upAgain.Seconds(), cliTook.Seconds(), recovered.Seconds())
}

func taskID(id string) asynq.Option { return asynq.TaskID(id) }
