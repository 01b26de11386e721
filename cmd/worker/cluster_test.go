package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/internal/rediscluster"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
)

func TestClusterConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		yaml string
		env  map[string]string
		want string // error substring; "" = valid
	}{
		{"cluster", "redis:\n  cluster_addrs: [127.0.0.1:7000, 127.0.0.1:7001]\n", nil, ""},
		{"env", "", map[string]string{"RMSGRAD_REDIS_CLUSTER_ADDRS": "127.0.0.1:7000, 127.0.0.1:7001", "RMSGRAD_SHARDS": "3"}, ""},
		{"with url", "redis:\n  url: redis://h:1\n  cluster_addrs: [127.0.0.1:7000]\n", nil, "redis.cluster_addrs: set it or redis.url"},
		{"with sentinel", "redis:\n  sentinel_master: m\n  sentinel_addrs: [h:1]\n  cluster_addrs: [127.0.0.1:7000]\n", nil, "has no Sentinel"},
		{"db", "redis:\n  db: 2\n  cluster_addrs: [127.0.0.1:7000]\n", nil, "only database 0"},
		{"not host:port", "redis:\n  cluster_addrs: [redis://h:1]\n", nil, "is not host:port"},
		{"negative shards", "shards: -1\n", nil, "shards (RMSGRAD_SHARDS): must be >= 0"},
		{"brace in queue", "queues: {\"a{b}\": 1}\n", nil, "contains a brace"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{}
			if c.yaml != "" {
				args = append(args, "--config", yamlFile(t, c.yaml))
			}
			cfg, _, err := loadConfig(args, func(k string) string { return c.env[k] }, os.Stderr)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				opt, err := redisOpt(cfg)
				if err != nil {
					t.Fatal(err)
				}
				co, ok := opt.(jobs.ClusterOpt)
				if !ok || len(co.Addrs) != 2 || co.Addrs[1] != "127.0.0.1:7001" {
					t.Fatalf("redis option %#v, want a cluster of the 2 seeds", opt)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
	cfg, _, err := loadConfig([]string{"--redis-cluster", "a:1,b:2", "--shards", "3"}, func(string) string { return "" }, os.Stderr)
	if err != nil || len(cfg.Redis.ClusterAddrs) != 2 || cfg.Shards != 3 {
		t.Fatalf("flags: %+v %v", cfg.Redis, err)
	}
}

// TestWorkerCluster runs the worker binary and the enqueue CLI against a
// real Redis Cluster (3 masters, 3 replicas) with TLS everywhere and a
// password, as a restricted ACL user, over 3 shards: jobs run end to end,
// /metrics shows each shard's depth, and when a master stops answering
// (SIGSTOP, as a host cut off by the network) /readyz names it until its
// replica has taken over.
func TestWorkerCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the worker binary against a 6-node Redis Cluster (about 30 s); make test runs it")
	}
	bin := buildWorkerBin(t)
	enq := filepath.Join(t.TempDir(), "enqueue")
	if out, err := exec.Command("go", "build", "-o", enq, "../enqueue").CombinedOutput(); err != nil {
		t.Fatalf("go build ../enqueue: %v\n%s", err, out)
	}
	f := testenv.NewTLS(t)
	const adminPW, userPW = "cluster-admin-pw", "rmsgrad-user-pw"
	c := testenv.RedisClusterWith(t, rediscluster.Options{Masters: 3, Replicas: 1, Password: adminPW, TLS: testenv.ClusterTLS(f)})
	ctx := context.Background()
	// ACLs are per node: the same restricted user on each.
	for _, n := range c.Nodes {
		if _, err := n.Do(ctx, "ACL", "SETUSER", "rmsgrad", "reset", "on", ">"+userPW, "~asynq:*", "&asynq:*", "+@all", "-@dangerous"); err != nil {
			t.Fatalf("ACL SETUSER on %s: %v", n.Addr, err)
		}
	}
	seeds := strings.Join(c.Addrs()[:2], ",")
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "redis-password")
	if err := os.WriteFile(pwFile, []byte(userPW+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cliCfg := filepath.Join(dir, "enqueue.yaml")
	if err := os.WriteFile(cliCfg, []byte("redis:\n  tls: true\n  username: rmsgrad\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cliEnv := cleanEnv("SSL_CERT_FILE="+f.CAFile, "RMSGRAD_REDIS_PASSWORD="+userPW, "RMSGRAD_REDIS_CLUSTER_ADDRS="+seeds)
	if out, err := runCLI(enq, cliEnv, "reshard", "--config", cliCfg, "--to", "3", "--settle", "100ms"); err != nil ||
		!strings.Contains(out, "3 shard(s)") {
		t.Fatalf("enqueue reshard --to 3: %v\n%s", err, out)
	}

	root, r, j := fileInputs(t)
	cfg := yamlFile(t, fmt.Sprintf("backend: cpu\nshards: 3\nredis:\n  cluster_addrs: [%s]\n  username: rmsgrad\n  password_file: %s\n  ca_file: %s\nstorage:\n  file_root: %s\n",
		seeds, pwFile, f.CAFile, root))
	w := runWorker(t, bin, cleanEnv(), "--config", cfg, "--log-level", "warn")
	w.waitReady(t, 200)
	client := jobs.ClusterOpt{RedisClusterClientOpt: asynq.RedisClusterClientOpt{Addrs: c.Addrs(), Username: "rmsgrad",
		Password: userPW, TLSConfig: f.ClientConfig()}}
	runOneJob(t, client, r, j, w)
	j.Out = strings.Replace(j.Out, "out.safetensors", "cli.safetensors", 1)
	enqueueCLI(t, enq, cliEnv, j, "--config", cliCfg)
	out, err := runCLI(enq, cliEnv, "shards", "--config", cliCfg)
	if err != nil {
		t.Fatalf("enqueue shards: %v\n%s", err, out)
	}
	t.Logf("enqueue shards:\n%s", out)
	for _, q := range jobs.ShardNames(jobs.DefaultQueue, 3) {
		if !strings.Contains(out, q) {
			t.Errorf("enqueue shards lacks shard %s", q)
		}
	}
	// /metrics: the depth of each shard that has seen a job (a queue
	// exists in asynq from its first task), 2 completed in all.
	_, metrics := w.get(t, "/metrics")
	completed := 0
	for _, m := range regexp.MustCompile(`rmsgrad_queue_tasks\{queue="([^"]+)",state="completed"\} (\d+)`).FindAllStringSubmatch(metrics, -1) {
		if !slices.Contains(jobs.ShardNames(jobs.DefaultQueue, 3), m[1]) {
			t.Errorf("/metrics: queue %q is not a shard", m[1])
		}
		v, _ := strconv.Atoi(m[2])
		completed += v
	}
	if completed != 2 {
		t.Errorf("/metrics: %v completed over the shards, want 2:\n%s", completed, grepLines(metrics, "rmsgrad_queue_tasks"))
	}
	// A pinned worker of another count refuses to start, naming both.
	bad := runWorker(t, bin, cleanEnv(), "--config", cfg, "--shards", "2", "--log-level", "warn")
	if err := <-bad.done; err == nil || !strings.Contains(bad.out.String(), "configured for 2 shards, Redis records 3") {
		t.Fatalf("worker with --shards 2 on a 3-shard queue: %v\n%s", err, bad.out.String())
	}

	// A master that stops answering is named, with its slots.
	m, err := c.MasterOf(ctx, jobs.QueueSlot(jobs.ShardName(jobs.DefaultQueue, 3, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(); err != nil {
		t.Fatal(err)
	}
	defer m.Resume()
	paused := time.Now()
	body := w.waitReady(t, 503, "redis cluster: node "+m.Addr+" (master of slots", "no answer within 1s")
	t.Logf("/readyz %v after %s was paused: %s", time.Since(paused).Round(time.Millisecond), m.Addr, strings.TrimSpace(body))
	// Its replica takes over (cluster-node-timeout 2 s): ready again, and
	// jobs of every shard run.
	w.waitReady(t, 200)
	t.Logf("ready again %v after the pause (the replica took over)", time.Since(paused).Round(time.Millisecond))
	for i := range 3 {
		j.Out = strings.Replace(j.Out, filepath.Base(j.Out), fmt.Sprintf("after-%d.safetensors", i), 1)
		runOneJob(t, client, r, j, w)
		t.Logf("job %d done %v after the pause", i, time.Since(paused).Round(time.Millisecond))
	}
	if err := m.Resume(); err != nil {
		t.Fatal(err)
	}
	w.stop(t)
}

func runCLI(bin string, env []string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Dir = os.TempDir()
	out, err := cmd.CombinedOutput()
	return string(out), err
}
