package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/storage"
)

func TestIsFailure(t *testing.T) {
	unavailable := &storage.Error{Op: "fetch", URI: "s3://b/k#x", Err: fmt.Errorf("%w: connection refused", storage.ErrUnavailable)}
	for _, c := range []struct {
		name    string
		err     error
		failure bool
	}{
		{"storage unavailable", jobErr("j", "x", "s3://b/k#x", unavailable), false},
		{"held at the gate", jobErr("j", "", "", fmt.Errorf("%w: held", ErrNotReady)), false},
		{"result not recorded", jobErr("j", "", "", fmt.Errorf("%w: dial tcp: refused", ErrResultUnavailable)), false},
		{"short read", jobErr("j", "x", "s3://b/k#x", fmt.Errorf("%w: cut", storage.ErrShortRead)), true},
		{"object changed", jobErr("j", "x", "s3://b/k#x", fmt.Errorf("%w: etag", storage.ErrChanged)), true},
		{"access denied", jobErr("j", "x", "s3://b/k#x", fmt.Errorf("%w: AccessDenied", storage.ErrAccess)), true},
		{"lease expired", asynq.ErrLeaseExpired, true},
		{"deadline", context.DeadlineExceeded, true},
		{"panic", errors.New("panic [handler.go:1]: boom"), true},
		// Permanent errors are archived at once (SkipRetry); never outages.
		{"permanent wrapping unavailable", jobErr("j", "x", "", fmt.Errorf("%w: %w", ErrLimit, storage.ErrUnavailable)), true},
	} {
		if got := IsFailure(c.err); got != c.failure {
			t.Errorf("%s: IsFailure(%v) = %v, want %v", c.name, c.err, got, c.failure)
		}
	}
	if IsFailure(nil) {
		t.Error("IsFailure(nil) = true")
	}
}

func TestRetryDelayOutageStreak(t *testing.T) {
	f := RetryDelay(time.Second, time.Hour)
	plain := jobErr("j", "", "", fmt.Errorf("%w: x", storage.ErrUnavailable))
	streak := jobErr("j", "", "", fmt.Errorf("%w: x", storage.ErrUnavailable))
	streak.OutageStreak = 5
	for range 50 {
		if d := f(0, plain, nil); d < 500*time.Millisecond || d > time.Second {
			t.Fatalf("no streak, n=0: %v, want in [0.5 s, 1 s]", d)
		}
		// 2^5 s with equal jitter.
		if d := f(0, streak, nil); d < 16*time.Second || d > 32*time.Second {
			t.Fatalf("streak 5, n=0: %v, want in [16 s, 32 s]", d)
		}
	}
}

func TestGate(t *testing.T) {
	ctx := context.Background()
	g := NewGate(200 * time.Millisecond)
	// Shut until the first probe.
	if err := g.Wait(ctx); !errors.Is(err, ErrNotReady) || !IsOutage(jobErr("j", "", "", err)) {
		t.Fatalf("Wait before the first Set = %v, want ErrNotReady", err)
	}
	g.Set(nil)
	t0 := time.Now()
	if err := g.Wait(ctx); err != nil || time.Since(t0) > 50*time.Millisecond {
		t.Fatalf("open gate: Wait = %v after %v", err, time.Since(t0))
	}

	// Shut: a job waits, and goes on as soon as the gate opens.
	g = NewGate(time.Minute)
	g.Set(errors.New("storage: down for 1s: refused"))
	done := make(chan error, 1)
	go func() { done <- g.Wait(ctx) }()
	for g.Held() != 1 {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v while the gate was shut", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.Set(errors.New("storage: down for 2s: refused")) // still down: stays shut
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v while the gate was still shut", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.Set(nil)
	if err := <-done; err != nil {
		t.Fatalf("Wait after the gate opened = %v", err)
	}
	if g.Held() != 0 {
		t.Fatalf("%d held after the gate opened", g.Held())
	}

	// The hold runs out: handed back, naming why.
	g = NewGate(100 * time.Millisecond)
	g.Set(errors.New("storage: down for 3s: refused"))
	err := g.Wait(ctx)
	if !errors.Is(err, ErrNotReady) || !IsOutage(err) || IsFailure(err) {
		t.Fatalf("held past the hold: %v, want an ErrNotReady outage", err)
	}
	if want := "storage: down"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name the dependency (%q)", err, want)
	}

	// A job's deadline shortens the hold.
	g = NewGate(time.Hour)
	g.Set(errors.New("redis: down"))
	dctx, cancel := context.WithTimeout(ctx, gateMargin+100*time.Millisecond)
	defer cancel()
	t0 = time.Now()
	if err := g.Wait(dctx); !errors.Is(err, ErrNotReady) || time.Since(t0) > time.Second {
		t.Fatalf("Wait with a deadline = %v after %v, want ErrNotReady before the deadline", err, time.Since(t0))
	}

	// Close lets held jobs go at once.
	g = NewGate(time.Hour)
	g.Set(errors.New("storage: down"))
	go func() { done <- g.Wait(ctx) }()
	for g.Held() != 1 {
		time.Sleep(time.Millisecond)
	}
	g.Close()
	if err := <-done; !errors.Is(err, ErrNotReady) {
		t.Fatalf("Wait after Close = %v, want ErrNotReady", err)
	}
	g.Set(nil)
	if err := g.Wait(ctx); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Wait on a closed gate = %v, want ErrNotReady", err)
	}
}

// TestHandlerGate: a job meets the gate after its checks and before any
// storage request: held while shut, handed back as an outage (no request
// made, not a failure), run once the gate opens; an outage met while
// running grows the job's streak, which a success resets.
func TestHandlerGate(t *testing.T) {
	e := newHandlerEnv(t, Limits{}, 1<<30, nil)
	g := NewGate(100 * time.Millisecond)
	e.h.cfg.Gate = g
	putInputs(e.store, "mem://ok/g", 1, []int{2, 8})
	var heads atomic.Int32
	down := false
	e.store.headErr = func(uri string) error {
		heads.Add(1)
		if down {
			return fmt.Errorf("%w: connection refused", storage.ErrUnavailable)
		}
		return nil
	}
	task := func() *asynq.Task { return asynq.NewTask(TaskType, payload(t, testJob("mem://ok/g"))) }
	g.Set(errors.New("storage: down for 1s"))
	err := e.h.ProcessTask(context.Background(), task())
	if !errors.Is(err, ErrNotReady) || IsFailure(err) || errors.Is(err, asynq.SkipRetry) || heads.Load() != 0 {
		t.Fatalf("held job: err %v after %d Heads, want ErrNotReady, not a failure, no request", err, heads.Load())
	}
	// Opens while held: the job runs.
	g2 := NewGate(time.Minute)
	g2.Set(errors.New("storage: down"))
	e.h.cfg.Gate = g2
	go func() {
		for g2.Held() == 0 {
			time.Sleep(time.Millisecond)
		}
		g2.Set(nil)
	}()
	if err := e.h.ProcessTask(context.Background(), task()); err != nil {
		t.Fatalf("job held, then the gate opened: %v", err)
	}
	// Outages met while running: the streak grows, then a success resets it.
	down = true
	ctx := context.Background()
	for want := 1; want <= 3; want++ {
		err := e.h.processTask(ctx, task())
		var je *JobError
		if !errors.As(err, &je) || je.OutageStreak != want || IsFailure(err) {
			t.Fatalf("outage %d: %v (streak %v), want streak %d, not a failure", want, err, je, want)
		}
	}
	down = false
	if err := e.h.processTask(ctx, task()); err != nil {
		t.Fatal(err)
	}
	down = true
	var je *JobError
	if err := e.h.processTask(ctx, task()); !errors.As(err, &je) || je.OutageStreak != 1 {
		t.Fatalf("after a success the streak should start over: %v", err)
	}
}

// TestFailureLevelOutcomes: each outcome's one log line says what happened
// to the job: an outage or a held job goes back to the queue uncounted, a
// backend panic is an error, and neither reads "job canceled".
func TestFailureLevelOutcomes(t *testing.T) {
	for _, c := range []struct {
		outcome string
		level   slog.Level
		msg     string
	}{
		{OutcomePermanent, slog.LevelInfo, "job rejected"},
		{OutcomeRetry, slog.LevelWarn, "job failed: will retry"},
		{OutcomePanic, slog.LevelError, "job failed: the compute backend panicked; will retry"},
		{OutcomeOutage, slog.LevelWarn, "job met an outage: back in the queue, not counted as a retry"},
		{OutcomeHeld, slog.LevelInfo, "job held while a dependency is down: back in the queue, not counted as a retry"},
		{OutcomeCanceled, slog.LevelWarn, "job canceled"},
	} {
		level, msg := failureLevel(context.Background(), c.outcome)
		if level != c.level || msg != c.msg {
			t.Errorf("outcome %s: %v %q, want %v %q", c.outcome, level, msg, c.level, c.msg)
		}
	}
}

// TestDeadlineErrorNamesTheJob: a job whose attempt runs into its deadline
// stops a margin before it, so that the error asynq records and archives is
// the job's own, naming the job, the tensor and its URI, and counts as a
// failure (asynq records a bare "context deadline exceeded" when the
// deadline passes while the handler runs).
func TestDeadlineErrorNamesTheJob(t *testing.T) {
	e := newHandlerEnv(t, Limits{}, 1<<30, nil)
	putInputs(e.store, "mem://ok/dl", 1, []int{2, 8})
	e.store.headCtx = func(ctx context.Context, uri string) error {
		if !strings.HasSuffix(uri, "/x") {
			return nil
		}
		<-ctx.Done() // a storage request that hangs
		return fmt.Errorf("head %s: %w", uri, ctx.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := e.h.processTask(ctx, asynq.NewTask(TaskType, payload(t, testJob("mem://ok/dl"))))
	if ctx.Err() != nil {
		t.Fatalf("the handler returned after the attempt's deadline: %v", err)
	}
	if err == nil || !IsFailure(err) || IsPermanent(err) || !strings.Contains(err.Error(), "tensor x (mem://ok/dl/x)") ||
		!errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v: want a counted, retryable failure naming tensor x and its URI, wrapping the deadline", err)
	}
}
