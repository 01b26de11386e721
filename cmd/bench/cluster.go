package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/rmsgrad/rmsgrad/internal/procattr"
	"github.com/rmsgrad/rmsgrad/internal/rediscluster"
	"github.com/rmsgrad/rmsgrad/jobs"
)

// The cluster section (-only cluster): what rmsgrad's task mix costs a Redis
// Cluster node, and how the no-op throughput of several worker processes
// moves as the queue goes from 1 shard to 3. It starts its own cluster (3
// masters, -cluster-replicas replicas each) and runs the worker side as
// child processes of this binary (-noop-worker): jobs.Servers, as
// bin/worker runs them, with a handler that does nothing, so the figures
// are the queue's alone.
//
// Costs are each master's user+sys CPU from /proc over a phase divided by
// the operations of the phase: a Redis node runs commands on one thread,
// so 1 s of its CPU per second is one core, its ceiling.

// clusterOps are the per-operation costs, in microseconds of Redis CPU
// (all masters together) per operation.
type clusterOps struct {
	Enqueue    float64 // jobs.Client.Enqueue with a caller id
	DequeueRun float64 // dequeue + mark complete (retention), no-op handler
	Result     float64 // the result write (ResultWriter) on top of it
	Lease      float64 // one heartbeat's lease extension + worker state, per active task
	Status     float64 // jobs.Client.Status (Wait polls it)
	IdleServer float64 // one idle asynq server (per shard) polling, per second
	// StatusRegistry is the part of Status spent on the node holding
	// asynq:queues (asynq's queue registry, which the Inspector reads on
	// every call): one node serves it for the whole cluster.
	StatusRegistry float64
}

// scaleRun is one throughput run.
type scaleRun struct {
	Shards, Procs int
	Tasks         int
	TasksPerS     float64
	NodeCores     []float64 // each master's CPU over the run, in cores
	WorkerCores   float64   // the worker processes' CPU, in cores
	MachineBusy   float64   // the whole machine's busy CPUs (/proc/stat), in cores
}

// runCluster is main's -only cluster.
func runCluster(ctx context.Context, o options) error {
	srv, err := findBinary("RMSGRAD_REDIS_SERVER", "redis-server")
	if err != nil {
		return err
	}
	cli, err := findBinary("RMSGRAD_REDIS_CLI", "redis-cli")
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "rmsgrad-cluster-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	c, err := rediscluster.Start(ctx, rediscluster.Options{Server: srv, CLI: cli, Dir: tmp, Masters: 3, Replicas: o.clusterReplicas,
		Extra: []string{"--cluster-require-full-coverage", "no"}})
	if err != nil {
		return err
	}
	defer c.Close()
	b := &clusterBench{c: c, self: self, conc: o.concurrency,
		opt: jobs.ClusterOpt{RedisClusterClientOpt: asynq.RedisClusterClientOpt{Addrs: c.Addrs()}}}
	if b.masters, err = b.masterNodes(ctx); err != nil {
		return err
	}
	b.rdb = b.opt.MakeRedisClient().(*redis.ClusterClient)
	defer b.rdb.Close()
	slog.Info("cluster up", "nodes", c.Addrs(), "replicas_per_master", o.clusterReplicas)

	ops, err := b.costs(ctx, o.scaled(20000))
	if err != nil {
		return err
	}
	var runs []scaleRun
	plan := []struct{ shards, procs int }{{1, 1}, {1, 3}, {3, 3}}
	for r := 0; r < o.repeat; r++ {
		for _, p := range plan {
			sr, err := b.scale(ctx, p.shards, p.procs, o.scaled(o.queueTasks))
			if err != nil {
				return err
			}
			runs = append(runs, sr)
		}
	}
	out := clusterReport(o, ops, runs)
	fmt.Print(out)
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(o.out, "cluster.md")
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		return err
	}
	slog.Info("report written", "file", path)
	return nil
}

type clusterBench struct {
	rdb     *redis.ClusterClient // the bench's own reads
	c       *rediscluster.Cluster
	opt     jobs.ClusterOpt
	self    string
	conc    int
	masters []*rediscluster.Node
}

func (b *clusterBench) masterNodes(ctx context.Context) ([]*rediscluster.Node, error) {
	top, err := b.c.Topology(ctx)
	if err != nil {
		return nil, err
	}
	var out []*rediscluster.Node
	for _, ni := range top {
		if ni.Master {
			out = append(out, b.c.Node(ni.Addr))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out, nil
}

// cpu returns each master's CPU so far.
func (b *clusterBench) cpu() ([]time.Duration, error) {
	var out []time.Duration
	for _, n := range b.masters {
		d, err := procCPU(n.PID())
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// phase runs f and returns the masters' CPU it cost, summed, and per node.
func (b *clusterBench) phase(f func() error) (time.Duration, []time.Duration, time.Duration, error) {
	before, err := b.cpu()
	if err != nil {
		return 0, nil, 0, err
	}
	t0 := time.Now()
	if err := f(); err != nil {
		return 0, nil, 0, err
	}
	wall := time.Since(t0)
	after, err := b.cpu()
	if err != nil {
		return 0, nil, 0, err
	}
	var sum time.Duration
	per := make([]time.Duration, len(after))
	for i := range after {
		per[i] = after[i] - before[i]
		sum += per[i]
	}
	return sum, per, wall, nil
}

// reset empties the cluster and records the layout of shards shards.
func (b *clusterBench) reset(ctx context.Context, shards int) error {
	for _, n := range b.masters {
		if _, err := n.Do(ctx, "FLUSHALL"); err != nil {
			return fmt.Errorf("FLUSHALL on %s: %w", n.Addr, err)
		}
	}
	if shards == 1 {
		return nil
	}
	cl := jobs.NewClient(b.opt)
	defer cl.Close()
	_, err := cl.Reshard(ctx, shards, jobs.ReshardOptions{Settle: time.Millisecond, Poll: 10 * time.Millisecond})
	return err
}

// fill enqueues n tasks with real payloads and ids through jobs.Client.
func (b *clusterBench) fill(ctx context.Context, cl *jobs.Client, prefix string, n int) error {
	g, gctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	for range 16 {
		g.Go(func() error {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return nil
				}
				j := benchJob(i)
				if _, err := cl.Enqueue(gctx, j, asynq.TaskID(fmt.Sprintf("%s-%d", prefix, i))); err != nil {
					return err
				}
			}
		})
	}
	return g.Wait()
}

// benchJob is a job of the shape cmd/enqueue writes (the payload asynq
// moves is the real one's size).
func benchJob(i int) jobs.Job {
	p := fmt.Sprintf("s3://%s/small/%06d/", benchBucket, i)
	return jobs.Job{X: p + "x.safetensors", W: p + "w.safetensors", DY: p + "dy.safetensors", Out: p + "out.safetensors", Eps: 1e-6}
}

// sampleResult is a result of the size a worker writes for a small job.
var sampleResult = func() []byte {
	r := jobs.Result{Out: "s3://bench/small/000000/out.safetensors", Rows: 8, Dim: 1024, Backend: "cpu", Worker: "worker-host-01",
		BatchID: "0123abcd-42", BatchJobs: 13, SHA256: map[string]string{
			"dx": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
			"dw": "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"},
		Timings: jobs.Timings{QueueWait: 1.234, Fetch: 0.456, Batch: 0.789, Compute: 0.123, Store: 0.987, Total: 2.5}}
	b, _ := json.Marshal(r)
	return b
}()

// drain serves the one-shard queue in process until n tasks completed.
func (b *clusterBench) drain(ctx context.Context, cl *jobs.Client, n int, h asynq.HandlerFunc) error {
	srv := jobs.NewServers(b.opt, jobs.ServersConfig{Queues: map[string]int{jobs.DefaultQueue: 1},
		Server: asynq.Config{Concurrency: b.conc, TaskCheckInterval: 100 * time.Millisecond, LogLevel: asynq.ErrorLevel}})
	if err := srv.Start(ctx, h); err != nil {
		return err
	}
	defer srv.Shutdown()
	return b.waitCompleted(ctx, cl, n)
}

// completed counts the completed tasks of the queue's current shards. It
// reads asynq's completed sets with ZCARD, one command per shard: the
// Inspector's GetQueueInfo also samples memory use with a script, which at
// the polling rate here would be a visible share of a node's CPU.
func (b *clusterBench) completed(ctx context.Context, cl *jobs.Client) (int, error) {
	l, err := cl.Layout(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, q := range l.Queues() {
		k, err := b.rdb.ZCard(ctx, "asynq:{"+q+"}:completed").Result()
		if err != nil {
			return 0, err
		}
		n += int(k)
	}
	return n, nil
}

// waitCompleted polls every 20 ms until the shards hold n completed tasks.
func (b *clusterBench) waitCompleted(ctx context.Context, cl *jobs.Client, n int) error {
	for {
		done, err := b.completed(ctx, cl)
		if err == nil && done >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d completed tasks: %w (last error %v)", n, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// costs measures each operation of the task mix on a one-shard queue.
func (b *clusterBench) costs(ctx context.Context, n int) (clusterOps, error) {
	var ops clusterOps
	us := func(d time.Duration, k int) float64 { return float64(d.Microseconds()) / float64(k) }
	if err := b.reset(ctx, 1); err != nil {
		return ops, err
	}
	cl := jobs.NewClient(b.opt)
	defer cl.Close()

	cpu, _, wall, err := b.phase(func() error { return b.fill(ctx, cl, "e", n) })
	if err != nil {
		return ops, err
	}
	ops.Enqueue = us(cpu, n)
	slog.Info("cluster cost: enqueue", "tasks", n, "us_per_task", ops.Enqueue, "per_s", float64(n)/wall.Seconds())

	noop := func(context.Context, *asynq.Task) error { return nil }
	cpu, _, wall, err = b.phase(func() error { return b.drain(ctx, cl, n, noop) })
	if err != nil {
		return ops, err
	}
	ops.DequeueRun = us(cpu, n)
	slog.Info("cluster cost: dequeue + complete", "tasks", n, "us_per_task", ops.DequeueRun, "per_s", float64(n)/wall.Seconds())

	if err := b.fill(ctx, cl, "r", n); err != nil {
		return ops, err
	}
	write := func(_ context.Context, t *asynq.Task) error {
		_, err := t.ResultWriter().Write(sampleResult)
		return err
	}
	cpu, _, _, err = b.phase(func() error { return b.drain(ctx, cl, 2*n, write) })
	if err != nil {
		return ops, err
	}
	ops.Result = math.Max(0, us(cpu, n)-ops.DequeueRun)
	slog.Info("cluster cost: result write", "us_per_task", ops.Result, "result_bytes", len(sampleResult))

	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("r-%d", i)
	}
	cpu, per, _, err := b.phase(func() error {
		g, gctx := errgroup.WithContext(ctx)
		var next atomic.Int64
		for range 16 {
			g.Go(func() error {
				for i := int(next.Add(1)) - 1; i < len(ids); i = int(next.Add(1)) - 1 {
					if _, err := cl.Status(gctx, ids[i]); err != nil {
						return err
					}
				}
				return nil
			})
		}
		return g.Wait()
	})
	if err != nil {
		return ops, err
	}
	ops.Status = us(cpu, len(ids))
	reg, err := b.c.MasterOf(ctx, jobs.KeySlot("asynq:queues"))
	if err != nil {
		return ops, err
	}
	shard, err := b.c.MasterOf(ctx, jobs.QueueSlot(jobs.DefaultQueue))
	if err != nil {
		return ops, err
	}
	if reg != shard {
		for i, n := range b.masters {
			if n == reg {
				ops.StatusRegistry = us(per[i], len(ids))
			}
		}
	}
	slog.Info("cluster cost: status", "us_per_call", ops.Status, "us_on_registry_node", ops.StatusRegistry)

	// Idle servers (each polls its shard ~10 times a second and beats
	// every 5 s) and leases (active tasks held across heartbeats), each
	// against a phase of the same length with nothing running (Redis's own
	// cron and the cluster bus).
	const hold, idlers, active = 20 * time.Second, 50, 10000
	base, _, _, err := b.phase(func() error { return sleepCtx(ctx, hold) })
	if err != nil {
		return ops, err
	}
	idle, _, _, err := b.phase(func() error {
		var all []*jobs.Servers
		defer func() {
			for _, s := range all {
				s.Shutdown()
			}
		}()
		for range idlers {
			s := jobs.NewServers(b.opt, jobs.ServersConfig{Queues: map[string]int{"bench-idle": 1},
				Server: asynq.Config{Concurrency: 1, TaskCheckInterval: 100 * time.Millisecond, LogLevel: asynq.ErrorLevel}})
			if err := s.Start(ctx, asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
				return err
			}
			all = append(all, s)
		}
		return sleepCtx(ctx, hold)
	})
	if err != nil {
		return ops, err
	}
	ops.IdleServer = math.Max(0, float64((idle-base).Microseconds())/idlers/hold.Seconds())

	srv := jobs.NewServers(b.opt, jobs.ServersConfig{Queues: map[string]int{jobs.DefaultQueue: 1},
		Server: asynq.Config{Concurrency: active, TaskCheckInterval: 100 * time.Millisecond, LogLevel: asynq.ErrorLevel}})
	release := make(chan struct{})
	var started atomic.Int64
	if err := srv.Start(ctx, asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		started.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})); err != nil {
		return ops, err
	}
	if err := b.fill(ctx, cl, "l", active); err != nil {
		srv.Shutdown()
		return ops, err
	}
	for started.Load() < active && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	busy, _, _, err := b.phase(func() error { return sleepCtx(ctx, hold) })
	close(release)
	srv.Shutdown()
	if err != nil {
		return ops, err
	}
	beats := hold.Seconds() / 5
	rest := float64(base.Microseconds()) + ops.IdleServer*hold.Seconds()
	ops.Lease = math.Max(0, (float64(busy.Microseconds())-rest)/(active*beats))
	slog.Info("cluster cost: idle servers and leases", "idle_server_us_per_s", ops.IdleServer, "us_per_task_per_heartbeat", ops.Lease)
	return ops, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// scale fills a queue of shards shards with n tasks, then drains it with
// procs worker processes and measures the middle 80% of the drain.
func (b *clusterBench) scale(ctx context.Context, shards, procs, n int) (scaleRun, error) {
	sr := scaleRun{Shards: shards, Procs: procs, Tasks: n}
	if err := b.reset(ctx, shards); err != nil {
		return sr, err
	}
	cl := jobs.NewClient(b.opt)
	defer cl.Close()
	if err := b.fill(ctx, cl, "s", n); err != nil {
		return sr, err
	}
	var children []*exec.Cmd
	defer func() {
		for _, c := range children {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range children {
			_ = c.Wait()
		}
	}()
	for range procs {
		cmd := exec.Command(b.self, "-noop-worker", strings.Join(b.c.Addrs(), ","), "-concurrency", strconv.Itoa(b.conc))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		cmd.SysProcAttr = procattr.Child()
		if err := cmd.Start(); err != nil {
			return sr, err
		}
		children = append(children, cmd)
	}
	lo, hi := n/10, n-n/10
	var t0, t1 time.Time
	var node0, node1 []time.Duration
	var w0, w1 time.Duration
	var m0, m1 float64
	sample := func() ([]time.Duration, time.Duration, float64, error) {
		nodes, err := b.cpu()
		if err != nil {
			return nil, 0, 0, err
		}
		var w time.Duration
		for _, c := range children {
			d, err := procCPU(c.Process.Pid)
			if err != nil {
				return nil, 0, 0, err
			}
			w += d
		}
		return nodes, w, machineBusy(), nil
	}
	for t1.IsZero() {
		done, err := b.completed(ctx, cl)
		if err != nil {
			return sr, err
		}
		now := time.Now()
		if t0.IsZero() && done >= lo {
			t0 = now
			if node0, w0, m0, err = sample(); err != nil {
				return sr, err
			}
		}
		if !t0.IsZero() && done >= hi {
			t1 = now
			if node1, w1, m1, err = sample(); err != nil {
				return sr, err
			}
		}
		if err := ctx.Err(); err != nil {
			return sr, fmt.Errorf("%d shards, %d processes: %d of %d done: %w", shards, procs, done, n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wall := t1.Sub(t0).Seconds()
	sr.TasksPerS = float64(hi-lo) / wall
	for i := range node1 {
		sr.NodeCores = append(sr.NodeCores, (node1[i]-node0[i]).Seconds()/wall)
	}
	sr.WorkerCores = (w1 - w0).Seconds() / wall
	sr.MachineBusy = (m1 - m0) / wall
	slog.Info("cluster scale", "shards", shards, "procs", procs, "tasks_per_s", sr.TasksPerS,
		"node_cores", sr.NodeCores, "worker_cores", sr.WorkerCores, "machine_busy_cores", sr.MachineBusy)
	return sr, nil
}

// ceiling is the run's throughput scaled to its busiest master using a
// whole core: where the queue itself would stop, given worker CPU.
func (r scaleRun) ceiling() float64 {
	hot := 0.0
	for _, c := range r.NodeCores {
		hot = max(hot, c)
	}
	if hot == 0 {
		return 0
	}
	return r.TasksPerS / hot
}

// machineBusy returns the machine's busy CPU time so far, in seconds
// (/proc/stat: all but idle and iowait).
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy float64
	for i, v := range f[1:] {
		x, _ := strconv.ParseFloat(v, 64)
		if i != 3 && i != 4 { // idle, iowait
			busy += x
		}
	}
	return busy / 100 // USER_HZ
}

// runNoopWorker is a child of the scale runs: jobs.Servers on the cluster,
// as bin/worker runs them, with a handler that does nothing, until SIGTERM.
func runNoopWorker(addrs string, concurrency int) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	opt := jobs.ClusterOpt{RedisClusterClientOpt: asynq.RedisClusterClientOpt{Addrs: strings.Split(addrs, ",")}}
	srv := jobs.NewServers(opt, jobs.ServersConfig{Queues: map[string]int{jobs.DefaultQueue: 1},
		Server: asynq.Config{Concurrency: concurrency, TaskCheckInterval: 100 * time.Millisecond,
			DelayedTaskCheckInterval: time.Second, LogLevel: asynq.ErrorLevel}})
	if err := srv.Start(ctx, asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		return err
	}
	<-ctx.Done()
	srv.Shutdown()
	return nil
}

// Projection inputs that are not measured here: what one Mac mini does.
const (
	miniSmallLow  = 1400 // small jobs/s: bin/worker on this 2-core VM (README benchmark table)
	miniSmallHigh = 5000 // small jobs/s: the 16-core GPU host's 4,700-5,900 (bench/gpu-host)
	miniLarge     = 4    // large (4096x4096) jobs/s: storage-bound, ~0.8 GB/s in and out per worker
	nodeBudget    = 0.5  // plan a node at half a core: headroom for a failover (a master taking a dead one's shards) and bursts
)

// clusterReport formats the section's tables and the projection.
func clusterReport(o options, ops clusterOps, runs []scaleRun) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "# Redis Cluster: per-node cost and shard scaling\n\n")
	fmt.Fprintf(&b, "Machine: %s, %s, %d CPUs; %s; redis %s; 3 masters, %d replica(s) each, loopback.\n\n",
		host, cpuModel(), runtime.NumCPU(), runtime.Version(), redisVersion(), o.clusterReplicas)
	fmt.Fprintf(&b, "## Cost per operation (Redis CPU, all masters, one shard)\n\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "operation\tus of Redis CPU\tops/s per Redis core")
	row := func(name string, v float64) {
		per := "-"
		if v > 0 {
			per = fmt.Sprintf("%.0f", 1e6/v)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%s\n", name, v, per)
	}
	row("enqueue (jobs.Client, caller id)", ops.Enqueue)
	row("dequeue + complete (retention)", ops.DequeueRun)
	row("result write (~"+strconv.Itoa(len(sampleResult))+" B)", ops.Result)
	row("lease extension + worker state, per active task per heartbeat (5 s)", ops.Lease)
	row("status (jobs.Client.Status, one Wait poll)", ops.Status)
	if ops.StatusRegistry > 0 {
		row("  of which on the node holding asynq:queues", ops.StatusRegistry)
	}
	tw.Flush()
	fmt.Fprintf(&b, "\nAn idle asynq server (one per shard per worker process, polling every 50-150 ms) costs %.0f us of Redis CPU per second.\n", ops.IdleServer)
	job := ops.Enqueue + ops.DequeueRun + ops.Result
	withWait := job + 3*ops.Status
	fmt.Fprintf(&b, "\nA job (enqueue, dequeue, result, complete): %.1f us, %.0f jobs/s per Redis core; with Wait (3 status polls): %.1f us, %.0f jobs/s.\n",
		job, 1e6/job, withWait, 1e6/withWait)

	fmt.Fprintf(&b, "\n## No-op task throughput, worker processes x shards\n\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "shards\tworker processes\ttasks/s (median)\truns\tRedis masters, cores each\tnode-bound ceiling, tasks/s\tworkers, cores\tmachine busy, cores")
	type key struct{ s, p int }
	by := map[key][]scaleRun{}
	var keys []key
	for _, r := range runs {
		k := key{r.Shards, r.Procs}
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], r)
	}
	med := map[key]scaleRun{}
	for _, k := range keys {
		rs := by[k]
		sort.Slice(rs, func(i, j int) bool { return rs[i].TasksPerS < rs[j].TasksPerS })
		m := rs[len(rs)/2]
		med[k] = m
		var all []string
		for _, r := range by[k] {
			all = append(all, fmt.Sprintf("%.0f", r.TasksPerS))
		}
		var nodes []string
		for _, c := range m.NodeCores {
			nodes = append(nodes, fmt.Sprintf("%.2f", c))
		}
		fmt.Fprintf(tw, "%d\t%d\t%.0f\t%s\t%s\t%.0f\t%.2f\t%.2f\n", k.s, k.p, m.TasksPerS, strings.Join(all, ", "), strings.Join(nodes, " / "),
			m.ceiling(), m.WorkerCores, m.MachineBusy)
	}
	tw.Flush()
	if a, c := med[key{1, 3}], med[key{3, 3}]; a.TasksPerS > 0 && c.TasksPerS > 0 {
		fmt.Fprintf(&b, "\nWith 3 worker processes, 3 shards / 1 shard: measured %.2fx; node-bound ceiling %.2fx. 3 shards and 3 processes / 1 shard and 1 process: %.2fx.\n",
			c.TasksPerS/a.TasksPerS, c.ceiling()/a.ceiling(), c.TasksPerS/med[key{1, 1}].TasksPerS)
		fmt.Fprintf(&b, "The node-bound ceiling is the run's tasks/s scaled until its busiest master uses a whole core (a Redis node runs commands on one thread).\n")
	}

	fmt.Fprintf(&b, "\n## Shards a fleet of Mac minis needs (projection)\n\n")
	fmt.Fprintf(&b, "From the per-job cost above (%.1f us with Wait), each master planned at %.0f%% of a core (%.0f jobs/s).\n"+
		"Per-mini rates are assumptions, not measured here: small jobs %d-%d jobs/s (this VM's bin/worker on 2 cores; the 16-core GPU host), large (4096x4096) %d jobs/s (storage-bound).\n\n",
		withWait, nodeBudget*100, nodeBudget*1e6/withWait, miniSmallLow, miniSmallHigh, miniLarge)
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "Mac minis\tsmall jobs/s\tshards (small)\tlarge jobs/s\tshards (large)")
	perNode := nodeBudget * 1e6 / withWait
	for _, minis := range []int{10, 100, 1000} {
		lo, hi := float64(minis*miniSmallLow), float64(minis*miniSmallHigh)
		lg := float64(minis * miniLarge)
		fmt.Fprintf(tw, "%d\t%.0f-%.0f\t%d-%d\t%.0f\t%d\n", minis, lo, hi,
			int(math.Ceil(lo/perNode)), int(math.Ceil(hi/perNode)), lg, int(math.Ceil(lg/perNode)))
	}
	tw.Flush()
	return b.String()
}

func redisVersion() string {
	bin, err := findBinary("RMSGRAD_REDIS_SERVER", "redis-server")
	if err != nil {
		return "?"
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "?"
	}
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return v
		}
	}
	return strings.TrimSpace(string(out))
}
