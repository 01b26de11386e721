package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// TestClusterKillWorker is TestKillMidBatch's command-buffer case on a Redis
// Cluster (3 masters) with the queue over 3 shards: a worker SIGKILLed
// while a command buffer is in flight, then a fresh one. Every job of every
// shard completes with outputs bitwise equal to a clean run's; the orphaned
// ones come back through asynq's recoverer (60-120 s).
func TestClusterKillWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: SIGKILL recovery waits out asynq's 30 s lease and 1 min recoverer")
	}
	t.Parallel()
	e := NewClusterEnv(t, 3, 0, 3)
	ids, js, ins, of := killJobs(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.EnqueueAll(ctx, ids, js, 8); err != nil {
		t.Fatal(err)
	}
	for _, q := range e.Queues {
		info, err := e.Insp.GetQueueInfo(q)
		if err != nil || info.Pending == 0 {
			t.Fatalf("shard %s: %+v %v: want jobs on every shard", q, info, err)
		}
	}
	cfg := WorkerConfig{Name: "a", LogLevel: "debug", MaxJobs: 16, MaxWait: 5 * time.Millisecond}
	var killedAt time.Time
	var cbJobs, attempts int
	for attempts = 1; attempts <= 5; attempts++ {
		w := StartWorker(t, workerBin, e, cfg)
		var fired atomic.Bool
		var cb, nj atomic.Int64
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
			t.Fatalf("worker %d exited (%v) before a command buffer of 4+ jobs was committed:\n%s", attempts, err, tail(w.Logs()))
		}
		cbJobs = int(nj.Load())
		if !cbDone(w.Logs(), cb.Load()) {
			break
		}
		t.Logf("attempt %d: command buffer %d finished before the kill landed; trying again", attempts, cb.Load())
	}
	if attempts > 5 {
		t.Fatal("5 kills all landed after their command buffer finished")
	}
	orphans := map[string]bool{}
	for _, q := range e.Queues {
		active, err := e.Insp.ListActiveTasks(q, asynq.PageSize(1000))
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Fatal(err)
		}
		for _, ti := range active {
			orphans[ti.ID] = true
		}
	}
	if len(orphans) < cbJobs {
		t.Fatalf("%d active tasks after the kill, want at least the %d of the command buffer in flight", len(orphans), cbJobs)
	}
	wb := StartWorker(t, workerBin, e, WorkerConfig{Name: "b", MaxJobs: 16})
	f, err := e.WaitFinal(ctx, ids)
	if err != nil {
		t.Fatalf("%v; lost %v", err, first(f.Lost, 10))
	}
	recovered := time.Since(killedAt)
	checkAll(t, ctx, e, f, ids, js, ins, of)
	for id := range orphans {
		if f.Retried[id] < 1 {
			t.Errorf("orphaned job %s completed with retried=%d, want >= 1", id, f.Retried[id])
		}
	}
	if err := wb.Term(60 * time.Second); err != nil {
		t.Fatalf("worker b after SIGTERM: %v", err)
	}
	t.Logf("FIGURE cluster-kill-worker masters=3 shards=3 jobs=%d lost=%d archived=%d orphaned=%d cb_jobs=%d kill_attempts=%d recovered_s=%.1f",
		len(ids), len(f.Lost), len(f.Archived), len(orphans), cbJobs, attempts, recovered.Seconds())
}

// ack is one acknowledged enqueue.
type ack struct {
	id    string
	shard int
	at    time.Time
}

// TestClusterMasterFailover SIGKILLs the master of one of 3 shards while
// jobs are being enqueued and run (3 masters with a replica each,
// cluster-node-timeout 2 s) and measures what an asynchronously
// replicated master loses:
//
//   - the replication window: how long a write the master acknowledged
//     took to reach its replica, sampled every 10 ms under the load;
//   - acknowledged enqueues lost (the job is nowhere afterwards), and jobs
//     run twice (their output written twice: a completion the replica had
//     not received, or a job in flight on that shard when its master
//     died, comes back when its lease expires);
//   - how long until the replica served the shard.
//
// It requires that whatever is lost or run twice is on the killed shard,
// that lost enqueues were acknowledged within the measured window before
// the kill, that the other shards never refused an enqueue, that every job
// not lost completed with the clean run's output, and that /readyz named
// the killed master while it was down.
func TestClusterMasterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: jobs run twice come back after asynq's 30 s lease and 1 min recoverer")
	}
	t.Parallel()
	const shards, n = 3, 1200
	e := NewClusterEnv(t, 3, 1, shards)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ins := e.Inputs(t, "fo", 21, [2]int{8, 256}, [2]int{16, 512}, [2]int{4, 1024}, [2]int{32, 128})
	puts := NewPutCounter(t, e.S3.Endpoint())
	w := StartWorker(t, workerBin, e, WorkerConfig{Name: "a", S3Endpoint: puts.Addr, MaxJobs: 16})

	const victim = 1
	l, err := e.Client.Layout(ctx)
	if err != nil {
		t.Fatal(err)
	}
	vq := jobs.ShardName(l.Queue, l.Shards, victim)
	master, err := e.Cluster.MasterOf(ctx, jobs.QueueSlot(vq))
	if err != nil {
		t.Fatal(err)
	}
	reps, err := e.Cluster.ReplicasOf(ctx, master.Addr)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replicas of %s: %v %v", master.Addr, reps, err)
	}
	lag := StartReplicationLag(master.Addr, reps[0].Addr, vq)

	// The feeder: about 250 enqueues a second from 4 goroutines, each
	// retried (under its id) until acknowledged.
	var (
		mu        sync.Mutex
		acks      []ack
		failures  = make([]int, shards)
		killed    = make(chan struct{})
		killedAt  time.Time
		next      atomic.Int64
		feeders   sync.WaitGroup
		jobOf     = map[string]jobs.Job{}
		inputOf   = map[string]*Input{}
		ackedOnce = map[string]bool{}
	)
	for i := range n {
		id := fmt.Sprintf("fo-%04d", i)
		jobOf[id] = ins[i%len(ins)].Job(outURI(id))
		inputOf[id] = ins[i%len(ins)]
	}
	for range 4 {
		feeders.Go(func() {
			tick := time.NewTicker(16 * time.Millisecond)
			defer tick.Stop()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				id := fmt.Sprintf("fo-%04d", i)
				for ctx.Err() == nil {
					<-tick.C
					actx, c := context.WithTimeout(ctx, 3*time.Second)
					_, err := e.Client.Enqueue(actx, jobOf[id], asynq.TaskID(id))
					c()
					mu.Lock()
					if err == nil {
						if !ackedOnce[id] {
							ackedOnce[id] = true
							acks = append(acks, ack{id, jobs.ShardOf(id, shards), time.Now()})
						}
						mu.Unlock()
						break
					}
					failures[jobs.ShardOf(id, shards)]++
					mu.Unlock()
				}
			}
		})
	}
	// Kill the master once a third of the jobs are in.
	for {
		mu.Lock()
		k := len(acks)
		mu.Unlock()
		if k >= n/3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("feeder stalled")
		}
		time.Sleep(5 * time.Millisecond)
	}
	samples, lagErrs := lag.Stop()
	master.Kill()
	killedAt = time.Now()
	close(killed)
	var named string
	var namedAfter time.Duration
	for time.Since(killedAt) < 20*time.Second {
		code, body, err := w.Readyz()
		if err == nil && code != 200 && strings.Contains(body, master.Addr) {
			named, namedAfter = strings.TrimSpace(body), time.Since(killedAt)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	nm, err := e.Cluster.WaitPromoted(ctx, master.Addr, jobs.QueueSlot(vq), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(killedAt)
	feeders.Wait()
	if ctx.Err() != nil {
		t.Fatal("feeders did not finish")
	}

	// Wait until no shard holds work (jobs run twice come back through the
	// recoverer), then read every job's end.
	for {
		info, err := e.queueInfo()
		if err == nil && info.Pending+info.Active+info.Scheduled+info.Retry == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("shards not drained: %+v %v", info, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	recovered := time.Since(killedAt)
	want := map[string]bool{}
	for _, a := range acks {
		want[a.id] = true
	}
	f, err := e.collect(want)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Archived) > 0 {
		t.Errorf("%d jobs archived: %v", len(f.Archived), f.Archived)
	}
	ackAt := map[string]ack{}
	for _, a := range acks {
		ackAt[a.id] = a
	}
	slices.Sort(samples)
	window := time.Duration(0)
	if len(samples) > 0 {
		window = samples[len(samples)-1]
	}
	var lostAge time.Duration
	for _, id := range f.Lost {
		a := ackAt[id]
		if a.shard != victim {
			t.Errorf("job %s of shard %d lost: only the killed shard %d may lose anything", id, a.shard, victim)
		}
		age := killedAt.Sub(a.at)
		lostAge = max(lostAge, age)
		// The window as measured, plus what the probe cannot see (the
		// enqueue's own round trip, scheduling on a loaded machine).
		if age > window+250*time.Millisecond {
			t.Errorf("job %s lost although acknowledged %v before the kill (replication window measured at most %v)", id, age, window)
		}
	}
	twice := 0
	for id, res := range f.Results {
		if err := CheckResult(res, inputOf[id], jobOf[id].Out); err != nil {
			t.Errorf("job %s: %v", id, err)
		}
		if p := puts.Puts(jobOf[id].Out); p > 1 {
			twice++
			if s := jobs.ShardOf(id, shards); s != victim {
				t.Errorf("job %s of shard %d ran %d times: only the killed shard's jobs may run again", id, s, p)
			}
		}
	}
	for i, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range f.Results {
			if !yield(id) {
				return
			}
		}
	}) {
		if i%25 == 0 { // the stored objects, a sample of them
			if err := e.CheckObject(ctx, inputOf[id], jobOf[id].Out); err != nil {
				t.Errorf("job %s: %v", id, err)
			}
		}
	}
	for s, k := range failures {
		if s != victim && k > 0 {
			t.Errorf("shard %d refused %d enqueues: only the killed shard may", s, k)
		}
	}
	if named == "" {
		t.Errorf("/readyz never named the killed master %s within 20 s", master.Addr)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	p := func(q float64) time.Duration {
		if len(samples) == 0 {
			return 0
		}
		return samples[int(q*float64(len(samples)-1))]
	}
	t.Logf("/readyz %v after the kill: %s", namedAfter.Round(time.Millisecond), named)
	t.Logf("FIGURE cluster-master-kill masters=3 replicas=1 shards=%d jobs=%d acked=%d acked_before_kill_on_shard=%d lost=%d run_twice=%d archived=%d "+
		"enqueue_failures_killed_shard=%d repl_window_ms_p50=%.2f p99=%.2f max=%.2f samples=%d probe_errors=%d lost_max_age_ms=%.1f "+
		"promoted_s=%.1f readyz_named_s=%.1f drained_s=%.1f new_master=%s",
		shards, n, len(acks), countBefore(acks, victim, killedAt), len(f.Lost), twice, len(f.Archived), failures[victim],
		ms(p(0.5)), ms(p(0.99)), ms(window), len(samples), lagErrs, ms(lostAge), promoted.Seconds(), namedAfter.Seconds(), recovered.Seconds(), nm.Addr)
}

func countBefore(acks []ack, shard int, t time.Time) int {
	k := 0
	for _, a := range acks {
		if a.shard == shard && a.at.Before(t) {
			k++
		}
	}
	return k
}
