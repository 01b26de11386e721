package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// killJobs uploads a few inputs of 0.25-2 MiB per tensor (so a batch's
// command buffer takes tens of milliseconds on the CPU) and returns 200
// jobs over them, each writing its own output.
func killJobs(t *testing.T, e *Env) (ids []string, js []jobs.Job, ins []*Input, of []int) {
	t.Helper()
	ins = e.Inputs(t, "kill", 11, [2]int{128, 4096}, [2]int{96, 4096}, [2]int{256, 2048}, [2]int{64, 4096},
		[2]int{200, 1024}, [2]int{128, 2048}, [2]int{32, 8192}, [2]int{100, 1000})
	for i := range 200 {
		in := ins[i%len(ins)]
		outs := []string(nil)
		if i%5 == 0 {
			outs = []string{"dx", "dw", "r"}
		}
		ids = append(ids, fmt.Sprintf("kill-%03d", i))
		js = append(js, in.Job(fmt.Sprintf("s3://%s/out/kill-%03d.safetensors", Bucket, i), outs...))
		of = append(of, i%len(ins))
	}
	return ids, js, ins, of
}

// checkAll requires every job completed with the clean run's outputs, in
// its result and in the stored object, and returns the final state.
func checkAll(t *testing.T, ctx context.Context, e *Env, f *Final, ids []string, js []jobs.Job, ins []*Input, of []int) {
	t.Helper()
	if len(f.Lost) > 0 || len(f.Archived) > 0 {
		t.Fatalf("%d jobs lost (%v), %d archived (%v)", len(f.Lost), first(f.Lost, 5), len(f.Archived), f.Archived)
	}
	for i, id := range ids {
		res := f.Results[id]
		if err := CheckResult(res, ins[of[i]], js[i].Out, js[i].Outputs...); err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
		if err := e.CheckObject(ctx, ins[of[i]], js[i].Out, js[i].Outputs...); err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
	}
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// logLine is the part of the worker's JSON log lines the tests read.
type logLine struct {
	Msg  string `json:"msg"`
	CB   int64  `json:"cb"`
	Jobs int    `json:"jobs"`
}

// TestKillMidBatch SIGKILLs a worker with 200 jobs queued, once while a
// command buffer is in flight (then restarts it) and once while uploads are
// half sent (with a second worker already running; against versitygw and
// against MinIO). Every job must reach
// completed with outputs bitwise equal to a clean run's. The orphaned jobs
// come back through asynq's recoverer: lease (30 s) + skew allowance (30 s)
// + up to one recoverer period (1 min), so this test takes 1-2.5 minutes.
func TestKillMidBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: SIGKILL recovery waits out asynq's 30 s lease and 1 min recoverer")
	}
	t.Parallel()
	t.Run("command-buffer-in-flight", func(t *testing.T) { t.Parallel(); killInFlight(t) })
	t.Run("upload-half-sent", func(t *testing.T) { t.Parallel(); killUploads(t, "versitygw") })
	t.Run("upload-half-sent-minio", func(t *testing.T) { t.Parallel(); killUploads(t, "minio") })
}

func killInFlight(t *testing.T) {
	e := NewEnv(t)
	ids, js, ins, of := killJobs(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.EnqueueAll(ctx, ids, js, 8); err != nil {
		t.Fatal(err)
	}
	cfg := WorkerConfig{Name: "a", LogLevel: "debug", MaxJobs: 16, MaxWait: 5 * time.Millisecond}
	// Kill on a "command buffer committed" line of a batch of 4 or more
	// jobs (the third command buffer or later); afterwards the log must lack that command buffer's "done" line,
	// which proves it was still in flight. A kill that came too late (the
	// machine is shared) is tried again on a fresh worker.
	var killedAt time.Time
	var killedCB int64
	var cbJobs, attempts int
	for attempts = 1; attempts <= 5; attempts++ {
		w := StartWorker(t, workerBin, e, cfg)
		var fired atomic.Bool
		var cb atomic.Int64
		var nj atomic.Int64
		pid := w.PID()
		w.OnLine(func(line string) {
			if fired.Load() || !strings.Contains(line, `"command buffer committed"`) {
				return
			}
			var l logLine
			if json.Unmarshal([]byte(line), &l) != nil || l.Jobs < 4 || l.CB < 3 {
				return
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
			fired.Store(true)
			cb.Store(l.CB)
			nj.Store(int64(l.Jobs))
		})
		guard := time.AfterFunc(2*time.Minute, func() {
			if !fired.Load() {
				w.Kill()
			}
		})
		err := w.Wait()
		guard.Stop()
		killedAt = time.Now()
		if !fired.Load() {
			t.Fatalf("worker %d exited (%v) (or was stopped after 2 minutes) before a command buffer of 4+ jobs was committed:\n%s", attempts, err, tail(w.Logs()))
		}
		killedCB, cbJobs = cb.Load(), int(nj.Load())
		if !cbDone(w.Logs(), killedCB) {
			break
		}
		t.Logf("attempt %d: command buffer %d finished before the kill landed; trying again", attempts, killedCB)
	}
	if attempts > 5 {
		t.Fatal("5 kills all landed after their command buffer finished")
	}
	active, err := e.Insp.ListActiveTasks(jobs.DefaultQueue, asynq.PageSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	orphans := map[string]bool{}
	for _, ti := range active {
		orphans[ti.ID] = true
	}
	if len(orphans) < cbJobs {
		t.Fatalf("%d active tasks after the kill, want at least the %d of the command buffer in flight", len(orphans), cbJobs)
	}
	// Restart: a fresh worker on the same queue.
	wb := StartWorker(t, workerBin, e, WorkerConfig{Name: "b", MaxJobs: 16})
	f, err := e.WaitFinal(ctx, ids)
	if err != nil {
		t.Fatalf("%v; lost %v", err, first(f.Lost, 10))
	}
	recovered := time.Since(killedAt)
	checkAll(t, ctx, e, f, ids, js, ins, of)
	for id := range orphans {
		if f.Retried[id] < 1 {
			t.Errorf("orphaned job %s completed with retried=%d, want >= 1 (recovered after its lease expired)", id, f.Retried[id])
		}
	}
	if err := wb.Term(60 * time.Second); err != nil {
		t.Fatalf("worker b after SIGTERM: %v", err)
	}
	t.Logf("FIGURE kill-inflight jobs=%d lost=%d archived=%d orphaned=%d cb_jobs=%d kill_attempts=%d recovered_s=%.1f",
		len(ids), len(f.Lost), len(f.Archived), len(orphans), cbJobs, attempts, recovered.Seconds())
}

func killUploads(t *testing.T, kind string) {
	e := NewEnvOn(t, kind)
	ids, js, ins, of := killJobs(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.EnqueueAll(ctx, ids, js, 8); err != nil {
		t.Fatal(err)
	}
	proxy := NewProxy(t, e.S3.Endpoint())
	wa := StartWorker(t, workerBin, e, WorkerConfig{Name: "a", S3Endpoint: proxy.Addr, MaxJobs: 16})
	// Let some jobs finish, then stall every upload half way.
	for proxy.Puts() < 10 {
		if wa.Exited() || ctx.Err() != nil {
			t.Fatalf("worker a made no uploads: %s", tail(wa.Logs()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	proxy.Hold()
	for proxy.Held() < 4 {
		if wa.Exited() || ctx.Err() != nil {
			t.Fatalf("no upload stalled: %s", tail(wa.Logs()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A second worker is running (straight to versitygw) when a dies.
	wb := StartWorker(t, workerBin, e, WorkerConfig{Name: "b", MaxJobs: 16})
	held := proxy.Held()
	wa.Kill()
	killedAt := time.Now()
	proxy.Release() // versitygw sees each stalled upload cut mid-body
	active, err := e.Insp.ListActiveTasks(jobs.DefaultQueue, asynq.PageSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	// What a cut upload leaves behind: nothing. Over plain HTTP the
	// worker's PUTs are unsigned, and versitygw v1.8.0 (posix) would commit
	// the bytes it got as a truncated object; the x-amz-checksum-crc32c that
	// storage/s3 sends with every single PUT makes it refuse the short body.
	partial := 0
	for i := range ids {
		if err := e.CheckObject(ctx, ins[of[i]], js[i].Out, js[i].Outputs...); err != nil && !strings.Contains(err.Error(), "not found") {
			if partial++; partial <= 3 {
				t.Logf("after the cut uploads: job %s: %v", ids[i], err)
			}
		}
	}
	if partial > 0 {
		t.Errorf("%d truncated or wrong output objects visible after the uploads were cut, want 0", partial)
	}
	f, err := e.WaitFinal(ctx, ids)
	if err != nil {
		t.Fatalf("%v; lost %v", err, first(f.Lost, 10))
	}
	recovered := time.Since(killedAt)
	checkAll(t, ctx, e, f, ids, js, ins, of)
	byA := 0
	for _, id := range ids {
		if f.Retried[id] >= 1 {
			byA++
		}
	}
	if byA < held {
		t.Fatalf("%d jobs retried, want at least the %d whose uploads were cut", byA, held)
	}
	if err := wb.Term(60 * time.Second); err != nil {
		t.Fatalf("worker b after SIGTERM: %v", err)
	}
	t.Logf("FIGURE kill-uploads server=%s jobs=%d lost=%d archived=%d uploads_cut=%d active_at_kill=%d retried=%d partial_objects_before_recovery=%d recovered_s=%.1f",
		kind, len(ids), len(f.Lost), len(f.Archived), held, len(active), byA, partial, recovered.Seconds())
}

// cbDone reports whether the log has command buffer cb's "done" line.
func cbDone(logs string, cb int64) bool {
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"command buffer done"`) {
			continue
		}
		var l logLine
		if json.Unmarshal([]byte(line), &l) == nil && l.CB == cb {
			return true
		}
	}
	return false
}

// tail returns the last lines of a log for a failure message.
func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}
