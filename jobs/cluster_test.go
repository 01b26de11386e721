package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
)

// shardWorker is a worker's parts on the shards: Servers and a batcher.
type shardWorker struct {
	srv *Servers
	b   *Batcher
}

func startShardWorker(t *testing.T, r asynq.RedisConnOpt, be compute.Backend, st Store, shards int) (*shardWorker, error) {
	t.Helper()
	b := NewBatcher(be, BatchConfig{MaxJobs: 16, MaxWait: 3 * time.Millisecond}, nil, nil)
	h, err := NewHandler(HandlerConfig{Backend: be, Batcher: b, Store: st, Budget: NewBudget(256 << 20), Worker: "cluster"})
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServers(r, ServersConfig{Queues: map[string]int{DefaultQueue: 1}, Shards: shards, Server: asynq.Config{
		Concurrency: 48, RetryDelayFunc: RetryDelay(50*time.Millisecond, 200*time.Millisecond),
		ShutdownTimeout: 20 * time.Second, LogLevel: asynq.WarnLevel, TaskCheckInterval: 50 * time.Millisecond}})
	mux := asynq.NewServeMux()
	h.Register(mux)
	if err := srv.Start(context.Background(), mux); err != nil {
		b.Close(context.Background())
		return nil, err
	}
	return &shardWorker{srv: srv, b: b}, nil
}

func (w *shardWorker) stop(t *testing.T) {
	w.srv.Shutdown()
	if err := w.b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestCluster runs jobs end to end on a real Redis Cluster (3 masters, 3
// replicas) over 3 shards: the shards land on the 3 masters, every shard
// gets work, a job is found from its id alone, re-enqueuing an id is a
// no-op, a client or worker configured for another shard count is refused,
// and a reshard refuses while the old shards hold work, stops enqueues
// while it drains them, and leaves old jobs findable.
func TestCluster(t *testing.T) {
	c := testenv.RedisCluster(t, 3, 1)
	r := asynq.RedisClusterClientOpt{Addrs: c.Addrs()}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := NewClient(r, WithPollInterval(50*time.Millisecond), WithMaxRetry(3))
	defer admin.Close()

	// An empty cluster: one shard, no record. Moving to 3 has nothing to
	// drain (the settle is short: no other client runs).
	if l, err := admin.Layout(ctx); err != nil || l.Shards != 1 {
		t.Fatalf("fresh layout %+v %v, want 1 shard", l, err)
	}
	l, err := admin.Reshard(ctx, 3, ReshardOptions{Settle: 100 * time.Millisecond, Poll: 100 * time.Millisecond})
	if err != nil || l.Shards != 3 || l.Prev != 1 || l.To != 0 {
		t.Fatalf("reshard 1 -> 3: %+v %v", l, err)
	}
	// Our hash slots are Redis's, and the 3 shards sit on 3 masters.
	for _, key := range append(l.Queues(), LayoutKey(DefaultQueue)) {
		k := key
		if !slices.Contains([]string{LayoutKey(DefaultQueue)}, key) {
			k = "asynq:{" + key + "}:pending"
		}
		got, err := c.Nodes[0].Do(ctx, "CLUSTER", "KEYSLOT", k)
		if err != nil || got != int64(KeySlot(k)) {
			t.Fatalf("CLUSTER KEYSLOT %s = %v (%v), KeySlot says %d", k, got, err, KeySlot(k))
		}
	}
	_, infos, err := admin.Shards(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]bool{}
	for _, si := range infos {
		nodes[si.Node] = true
	}
	if len(infos) != 3 || len(nodes) != 3 || nodes[""] {
		t.Fatalf("shards %+v: want 3 shards on 3 distinct masters", infos)
	}

	// A client or worker pinned to another count is refused, naming both.
	pinned := NewClient(r, WithShards(2))
	defer pinned.Close()
	if _, err := pinned.Enqueue(ctx, testJob("mem://ok/x")); !errors.Is(err, ErrLayoutMismatch) {
		t.Fatalf("enqueue with shards=2 on a 3-shard queue: %v, want ErrLayoutMismatch", err)
	}
	if _, err := pinned.Status(ctx, "any"); !errors.Is(err, ErrLayoutMismatch) {
		t.Fatalf("status with shards=2: %v, want ErrLayoutMismatch", err)
	}
	st := newMemStore("mem://ok/")
	be := cpu.New()
	if _, err := startShardWorker(t, r, be, st, 2); !errors.Is(err, ErrLayoutMismatch) {
		t.Fatalf("worker with shards=2: %v, want ErrLayoutMismatch", err)
	}

	w, err := startShardWorker(t, r, be, st, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { w.stop(t) }()
	// The 3 shards, and the unsharded queue (the previous layout) until
	// its results expire.
	if got, want := w.srv.Queues(), slices.Sorted(slices.Values(append(l.Queues(), DefaultQueue))); !slices.Equal(got, want) {
		t.Fatalf("worker serves %v, want %v", got, want)
	}
	const n = 90
	ids := make([]string, n)
	shapes := make([][]int, n)
	var wg sync.WaitGroup
	for i := range n {
		shapes[i] = []int{1 + i%9, []int{7, 64, 256}[i%3]}
		p := fmt.Sprintf("mem://ok/c%d", i)
		putInputs(st, p, uint64(i), shapes[i])
		wg.Go(func() {
			opts := []asynq.Option{asynq.TaskID(fmt.Sprintf("cl-%d", i))}
			if i%3 == 0 {
				opts = nil // the client picks the id (and so the shard)
			}
			id, err := admin.Enqueue(ctx, testJob(p), opts...)
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i, id := range ids {
		res, err := admin.Wait(ctx, id)
		if err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
		rows, dim := shapes[i][0], shapes[i][1]
		alone := newWork(t, be, 0, rows, dim)
		p := fmt.Sprintf("mem://ok/c%d", i)
		copy(alone.X.Bytes(), st.tensors[p+"/x"].data)
		copy(alone.W.Bytes(), st.tensors[p+"/w"].data)
		copy(alone.DY.Bytes(), st.tensors[p+"/dy"].data)
		one := compute1(t, be, alone)
		if res.Rows != rows || !slices.Equal(st.output(res.Out, "dx"), one.DX.Float32s()) || !slices.Equal(st.output(res.Out, "dw"), one.DW.Float32s()) {
			t.Fatalf("job %s: output differs bitwise from a single-job run (result %+v)", id, res)
		}
	}
	_, infos, err = admin.Shards(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, si := range infos {
		if si.Completed == 0 {
			t.Errorf("shard %s (%s) completed no job: the ids do not spread", si.Queue, si.Node)
		}
		total += si.Completed
	}
	if total != n {
		t.Fatalf("%d completed over the shards, want %d: %+v", total, n, infos)
	}
	// Found from the id alone by a fresh client, in the id's shard; a
	// repeated enqueue is a no-op.
	fresh := NewClient(r)
	defer fresh.Close()
	for _, id := range ids[:6] {
		s, err := fresh.Status(ctx, id)
		if err != nil || s.State != StateCompleted || s.Queue != l.QueueFor(id) {
			t.Fatalf("status of %s: %+v %v, want completed in %s", id, s, err, l.QueueFor(id))
		}
	}
	if id, err := fresh.Enqueue(ctx, testJob("mem://ok/c1"), asynq.TaskID("cl-1")); err != nil || id != "cl-1" {
		t.Fatalf("re-enqueue of cl-1: %q %v, want a no-op", id, err)
	}
	if _, err := fresh.Enqueue(ctx, testJob("mem://ok/c2"), asynq.TaskID("cl-1")); !errors.Is(err, ErrIDReused) {
		t.Fatalf("another job under cl-1: %v, want ErrIDReused", err)
	}

	// Reshard 3 -> 2 while the old shards hold work nobody runs: refused
	// after the drain wait, nothing changed, enqueues resume.
	w.stop(t)
	w = nil
	var queued []string
	for i := range 6 {
		p := fmt.Sprintf("mem://ok/q%d", i)
		putInputs(st, p, uint64(100+i), []int{2, 64})
		id, err := admin.Enqueue(ctx, testJob(p), asynq.TaskID(fmt.Sprintf("q-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, id)
	}
	_, err = admin.Reshard(ctx, 2, ReshardOptions{Settle: 100 * time.Millisecond, Drain: 500 * time.Millisecond, Poll: 100 * time.Millisecond})
	if !errors.Is(err, ErrNotDrained) {
		t.Fatalf("reshard with 6 jobs queued and no worker: %v, want ErrNotDrained", err)
	}
	if l2, _ := ReadLayout(ctx, admin.rdb, DefaultQueue); l2.Shards != 3 || l2.To != 0 {
		t.Fatalf("after the refused reshard: %+v, want 3 shards and no reshard in progress", l2)
	}
	t.Logf("refused: %v", err)

	// With a worker running it drains them; meanwhile enqueues are refused.
	w, err = startShardWorker(t, r, be, st, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := admin.Reshard(ctx, 2, ReshardOptions{Settle: 1500 * time.Millisecond, Poll: 100 * time.Millisecond})
		done <- err
	}()
	sawRefusal := false
	for !sawRefusal {
		fresh.layout.invalidate()
		_, err := fresh.Enqueue(ctx, testJob("mem://ok/c1"), asynq.TaskID("during"))
		if errors.Is(err, ErrResharding) {
			sawRefusal = true
			break
		}
		select {
		case err := <-done:
			t.Fatalf("reshard finished (%v) before an enqueue was refused", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	l, err = admin.Layout(ctx)
	if err != nil || l.Shards != 2 || l.Prev != 3 {
		t.Fatalf("after reshard 3 -> 2: %+v %v", l, err)
	}
	// Old jobs: found through the previous layout, re-enqueue is a no-op.
	fresh.layout.invalidate()
	for _, id := range append(queued, ids[:6]...) {
		s, err := fresh.Status(ctx, id)
		if err != nil || s.State != StateCompleted {
			t.Fatalf("status of old job %s after the reshard: %+v %v", id, s, err)
		}
	}
	if id, err := fresh.Enqueue(ctx, testJob("mem://ok/c1"), asynq.TaskID("cl-1")); err != nil || id != "cl-1" {
		t.Fatalf("re-enqueue of cl-1 after the reshard: %q %v, want a no-op", id, err)
	}
	// New jobs go to the 2 new shards, which the worker serves once it has
	// re-read the layout (within LayoutRefresh), beside the old ones.
	id, err := fresh.Enqueue(ctx, testJob("mem://ok/c3"), asynq.TaskID("after"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Wait(ctx, id); err != nil {
		t.Fatalf("job after the reshard: %v", err)
	}
	want := slices.Sorted(slices.Values(l.Served(time.Now())))
	if got := w.srv.Queues(); !slices.Equal(got, slices.Compact(want)) {
		t.Fatalf("worker serves %v after the reshard, want %v", got, want)
	}
}
