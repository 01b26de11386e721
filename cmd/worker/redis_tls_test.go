package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/s3"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// inputObject is a small valid x, w, dy safetensors object.
func inputObject(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := safetensors.Encode(&b, []safetensors.Tensor{
		safetensors.F32("x", []int{3, 4}, []float32{1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12}),
		safetensors.F32("w", []int{4}, []float32{0.5, 1, 1.5, 2}),
		safetensors.F32("dy", []int{3, 4}, []float32{1, 1, 1, 1, -1, 0, 1, 0, 0.5, 0.25, 0, -2}),
	}, nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// fileInputs writes the input object under a new file store root and
// returns the root and a job writing to out.safetensors there.
func fileInputs(t *testing.T) (string, *storage.Router, jobs.Job) {
	t.Helper()
	root := t.TempDir()
	fs, err := file.New(root)
	if err != nil {
		t.Fatal(err)
	}
	r := storage.NewRouter()
	r.Register("file", fs)
	in := "file://" + filepath.Join(root, "in.safetensors")
	obj := inputObject(t)
	if err := r.Put(context.Background(), in, bytes.NewReader(obj), int64(len(obj))); err != nil {
		t.Fatal(err)
	}
	return root, r, jobs.Job{X: in + "#x", W: in + "#w", DY: in + "#dy", Out: "file://" + filepath.Join(root, "out.safetensors"), Eps: 1e-6}
}

// runOneJob enqueues j through a jobs.Client on opt (the orchestrator's
// side), waits for it and checks the output object holds dx and dw.
func runOneJob(t *testing.T, opt asynq.RedisConnOpt, r *storage.Router, j jobs.Job, w *proc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := jobs.NewClient(opt, jobs.WithPollInterval(20*time.Millisecond), jobs.WithMaxRetry(2))
	defer c.Close()
	id, err := c.Enqueue(ctx, j)
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	res, err := c.Wait(ctx, id)
	if err != nil {
		t.Fatalf("job %s: %v\nworker output:\n%s", id, err, w.out.String())
	}
	if res.Rows != 3 || res.Dim != 4 || res.SHA256["dx"] == "" || res.SHA256["dw"] == "" {
		t.Fatalf("job %s: result %+v", id, res)
	}
	for _, name := range []string{"dx", "dw"} {
		if _, err := r.Head(ctx, j.Out+"#"+name); err != nil {
			t.Fatalf("job %s: output %s: %v", id, name, err)
		}
	}
}

// enqueueCLI runs `enqueue submit --wait --json` for j with the given
// connection flags and environment, in an empty directory (so no
// configs/enqueue.yaml is picked up), and fails unless the job completes.
func enqueueCLI(t *testing.T, bin string, env []string, j jobs.Job, conn ...string) {
	t.Helper()
	args := append([]string{"submit", "--x", j.X, "--w", j.W, "--dy", j.DY, "--out", j.Out, "--wait", "--json"}, conn...)
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir = env, t.TempDir()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), j.Out) {
		t.Fatalf("enqueue %q: %v\n%s", args, err, out)
	}
}

func yamlFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "worker.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWorkerConnections runs the worker binary and a jobs.Client against
// each way of reaching Redis and S3 securely: a password-protected Redis
// with a restricted ACL user, Redis over TLS only (rediss://, a private
// CA), Redis through Sentinel (asynq's failover options), and S3 over TLS
// with a custom CA bundle. In each, a job runs end to end; where a
// misconfiguration must be refused, it is.
func TestWorkerConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the worker binary against several servers (about 30 s); make test runs it")
	}
	bin := buildWorkerBin(t)
	// The enqueue CLI is the other side of the queue.
	enq := filepath.Join(t.TempDir(), "enqueue")
	if out, err := exec.Command("go", "build", "-o", enq, "../enqueue").CombinedOutput(); err != nil {
		t.Fatalf("go build ../enqueue: %v\n%s", err, out)
	}

	t.Run("redis ACL user", func(t *testing.T) {
		const adminPW, userPW = "admin-pw-for-acl-test", "rmsgrad-user-pw"
		rs := testenv.Redis(t, "--requirepass", adminPW)
		admin := []string{adminPW}
		// The worker's user may touch asynq's keys and channels only,
		// and no dangerous commands (CONFIG, FLUSHALL, DEBUG, ...).
		if v := testenv.RedisDo(t, rs, admin, "ACL", "SETUSER", "rmsgrad", "reset", "on", ">"+userPW,
			"~asynq:*", "&asynq:*", "+@all", "-@dangerous"); v != "OK" {
			t.Fatalf("ACL SETUSER: %v", v)
		}
		// The ACL is in force: no anonymous access, and the user cannot
		// leave asynq's keys or run admin commands.
		c, err := testenv.DialRedis(rs.Addr, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Do("PING"); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
			t.Fatalf("anonymous PING: %v, want NOAUTH", err)
		}
		if _, err := c.Do("AUTH", "rmsgrad", userPW); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Do("GET", "not-asynq"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Fatalf("user GET outside asynq:*: %v, want NOPERM", err)
		}
		if _, err := c.Do("FLUSHALL"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Fatalf("user FLUSHALL: %v, want NOPERM", err)
		}

		root, r, j := fileInputs(t)
		cfg := yamlFile(t, fmt.Sprintf("backend: cpu\nredis:\n  addr: %s\n  username: rmsgrad\nstorage:\n  file_root: %s\n", rs.Addr, root))
		w := runWorker(t, bin, cleanEnv("RMSGRAD_REDIS_PASSWORD="+userPW), "--config", cfg, "--log-level", "warn")
		w.waitReady(t, 200)
		runOneJob(t, asynq.RedisClientOpt{Addr: rs.Addr, Username: "rmsgrad", Password: userPW}, r, j, w)
		j.Out = strings.Replace(j.Out, "out.safetensors", "cli.safetensors", 1)
		enqueueCLI(t, enq, cleanEnv("RMSGRAD_REDIS_USERNAME=rmsgrad", "RMSGRAD_REDIS_PASSWORD="+userPW), j, "--redis", rs.Addr, "--root", root)
		// Queue depth (asynq.Inspector) works under the restricted user.
		if _, m := w.get(t, "/metrics"); !strings.Contains(m, `rmsgrad_queue_tasks{queue="rmsnorm",state="completed"} 2`) {
			t.Errorf("/metrics under the ACL user lacks the queue depth:\n%s", grepLines(m, "rmsgrad_queue_tasks"))
		}
		w.stop(t)
		if out := w.out.String(); strings.Contains(out, "NOPERM") {
			t.Errorf("the worker ran a command its ACL user may not:\n%s", out)
		}

		// The wrong user password is refused and reported.
		bad := runWorker(t, bin, cleanEnv("RMSGRAD_REDIS_PASSWORD=not-the-password"), "--config", cfg, "--log-level", "warn")
		bad.waitReady(t, 503, "redis", "WRONGPASS")
	})

	t.Run("redis TLS", func(t *testing.T) {
		f := testenv.NewTLS(t)
		const pw = "tls-redis-pw"
		rs := testenv.RedisTLS(t, f, "--requirepass", pw)
		root, r, j := fileInputs(t)
		client := asynq.RedisClientOpt{Addr: rs.Addr, Password: pw, TLSConfig: f.ClientConfig()}
		for _, c := range []struct{ name, redis string }{
			{"rediss URL", fmt.Sprintf("  url: rediss://%s\n  ca_file: %s\n", rs.Addr, f.CAFile)},
			{"addr with tls", fmt.Sprintf("  addr: %s\n  tls: true\n  ca_file: %s\n", rs.Addr, f.CAFile)},
		} {
			t.Run(c.name, func(t *testing.T) {
				cfg := yamlFile(t, fmt.Sprintf("backend: cpu\nredis:\n%sstorage:\n  file_root: %s\n", c.redis, root))
				w := runWorker(t, bin, cleanEnv("RMSGRAD_REDIS_PASSWORD="+pw), "--config", cfg, "--log-level", "warn")
				w.waitReady(t, 200)
				j := j
				j.Out = strings.Replace(j.Out, "out.safetensors", strings.ReplaceAll(c.name, " ", "-")+".safetensors", 1)
				runOneJob(t, client, r, j, w)
				// The CLI has no Redis CA setting; Go's SSL_CERT_FILE
				// makes it trust the private CA.
				j.Out = strings.Replace(j.Out, ".safetensors", "-cli.safetensors", 1)
				enqueueCLI(t, enq, cleanEnv("SSL_CERT_FILE="+f.CAFile, "RMSGRAD_REDIS_PASSWORD="+pw), j, "--redis", "rediss://"+rs.Addr, "--root", root)
				w.stop(t)
			})
		}
		// Without the CA the worker must not trust the server; a plain
		// connection to the TLS port gets nowhere either.
		for _, c := range []struct{ name, redis, want string }{
			{"without ca_file", fmt.Sprintf("  url: rediss://%s\n", rs.Addr), "certificate signed by unknown authority"},
			{"without TLS", fmt.Sprintf("  addr: %s\n", rs.Addr), "redis:"},
		} {
			t.Run(c.name, func(t *testing.T) {
				cfg := yamlFile(t, fmt.Sprintf("backend: cpu\nredis:\n%sstorage:\n  file_root: %s\n", c.redis, root))
				w := runWorker(t, bin, cleanEnv("RMSGRAD_REDIS_PASSWORD="+pw), "--config", cfg, "--log-level", "warn")
				t.Logf("/readyz %s: %s", c.name, strings.TrimSpace(w.waitReady(t, 503, c.want)))
			})
		}
	})

	t.Run("redis sentinel", func(t *testing.T) {
		const pw = "sentinel-master-pw"
		const name = "rmsgrad-master"
		master := testenv.Redis(t, "--requirepass", pw)
		sent := testenv.Sentinel(t, master, name, pw)
		root, r, j := fileInputs(t)
		// addr points nowhere: the worker can only find the master
		// through the sentinel.
		cfg := yamlFile(t, fmt.Sprintf("backend: cpu\nredis:\n  addr: 127.0.0.1:1\n  sentinel_master: %s\n  sentinel_addrs: [%s]\nstorage:\n  file_root: %s\n",
			name, sent.Addr, root))
		w := runWorker(t, bin, cleanEnv("RMSGRAD_REDIS_PASSWORD="+pw), "--config", cfg, "--log-level", "warn")
		w.waitReady(t, 200)
		runOneJob(t, asynq.RedisFailoverClientOpt{MasterName: name, SentinelAddrs: []string{sent.Addr}, Password: pw}, r, j, w)
		w.stop(t)
		// The job's task lives on the master the sentinel named.
		keys := testenv.RedisDo(t, master, []string{pw}, "KEYS", "asynq:{rmsnorm}:t:*")
		if k, ok := keys.([]any); !ok || len(k) == 0 {
			t.Fatalf("no asynq task keys on the master: %v", keys)
		}
	})

	t.Run("s3 TLS with a custom CA", func(t *testing.T) {
		f := testenv.NewTLS(t)
		gw := testenv.VersitygwTLS(t, f, "tensors")
		rs := testenv.Redis(t)
		ctx := context.Background()
		st, err := s3.New(ctx, s3.Config{Endpoint: gw.Endpoint(), AccessKey: gw.AccessKey, SecretKey: gw.SecretKey,
			TLS: true, CAFile: f.CAFile, Allow: []s3.AllowRule{{Bucket: "tensors"}}})
		if err != nil {
			t.Fatal(err)
		}
		r := storage.NewRouter()
		r.Register("s3", st)
		obj := inputObject(t)
		in := "s3://tensors/in.safetensors"
		if err := r.Put(ctx, in, bytes.NewReader(obj), int64(len(obj))); err != nil {
			t.Fatalf("upload over TLS: %v", err)
		}
		j := jobs.Job{X: in + "#x", W: in + "#w", DY: in + "#dy", Out: "s3://tensors/out.safetensors", Eps: 1e-6}
		env := cleanEnv("RMSGRAD_S3_ACCESS_KEY="+gw.AccessKey, "RMSGRAD_S3_SECRET_KEY="+gw.SecretKey)
		s3cfg := func(extra string) string {
			return yamlFile(t, fmt.Sprintf("backend: cpu\nredis:\n  addr: %s\nstorage:\n  s3:\n    endpoint: %s\n    tls: true\n%s    allow: [{bucket: tensors}]\n",
				rs.Addr, gw.Endpoint(), extra))
		}
		w := runWorker(t, bin, env, "--config", s3cfg("    ca_file: "+f.CAFile+"\n"), "--log-level", "warn")
		w.waitReady(t, 200)
		runOneJob(t, asynq.RedisClientOpt{Addr: rs.Addr}, r, j, w)
		w.stop(t)

		// Without the bundle the system roots do not trust the server.
		bad := runWorker(t, bin, env, "--config", s3cfg(""), "--log-level", "warn")
		t.Logf("/readyz without the CA bundle: %s", strings.TrimSpace(bad.waitReady(t, 503, "storage", "certificate signed by unknown authority")))
	})
}
