package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// proc is one run of the worker binary with everything it printed.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuf
	http string
	done chan error
}

// buildWorkerBin builds the worker once per calling test.
func buildWorkerBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// cleanEnv is the test process's environment without any RMSGRAD_*
// variable, plus extra.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RMSGRAD_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// runWorker starts the binary with a fresh --http port and waits until
// /healthz answers (not /readyz: some runs here are meant never to become
// ready).
func runWorker(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{out: &syncBuf{}, http: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), done: make(chan error, 1)}
	p.cmd = exec.Command(bin, append([]string{"--http", p.http}, args...)...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-p.done:
			p.done <- err
			return p // exited early; the caller looks at why
		default:
		}
		if resp, err := http.Get("http://" + p.http + "/healthz"); err == nil {
			resp.Body.Close()
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker did not serve /healthz:\n%s", p.out.String())
		}
	}
}

// get returns the status and body of one of the worker's HTTP paths.
func (p *proc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.http + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitReady polls /readyz until it answers want (200 or 503) with a body
// holding every one of contains (and past the first probe), and returns
// the body.
func (p *proc) waitReady(t *testing.T, want int, contains ...string) string {
	t.Helper()
	var code int
	var body string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		code, body = p.get(t, "/readyz")
		if code != want || strings.Contains(body, "not probed yet") {
			continue
		}
		ok := true
		for _, c := range contains {
			ok = ok && strings.Contains(body, c)
		}
		if ok {
			return body
		}
	}
	t.Fatalf("/readyz answered %d %q, want %d with %q; worker output:\n%s", code, body, want, contains, p.out.String())
	return ""
}

// stop sends SIGTERM and requires exit 0.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("worker exit after SIGTERM: %v\n%s", err, p.out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("worker did not exit after SIGTERM:\n%s", p.out.String())
	}
}

// TestWorkerNeverPrintsSecrets runs the worker binary with known secrets
// (the Redis password, the S3 access and secret keys, the signing key),
// given through the environment and through files, drives jobs through it
// (completing, failing on a missing input, unsigned, one smuggling the
// worker's own keys into a URI, and a run with a wrong S3 secret and one
// with a wrong Redis password), and searches everything the worker wrote
// (stdout, stderr, --print-config, config errors, /metrics, /readyz, job
// results and error messages, output objects) for every secret.
func TestWorkerNeverPrintsSecrets(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the worker binary against several servers (about 30 s); make test runs it")
	}
	const (
		redisPW    = "redis-pw-Q7f3XkzPw"
		accessKey  = "AKIDq2w9e8r7t6y5"
		secretKey  = "s3-secret-Zk8Lm4PqRs"
		signKey    = "sign-key-Hb5Vn1RtUe"
		wrongS3    = "wrong-s3-secret-Yx3Cc7Dd"
		wrongRedis = "wrong-redis-pw-Jm2Kk9Ll"
	)
	secrets := []string{redisPW, accessKey, secretKey, signKey, wrongS3, wrongRedis}
	bin := buildWorkerBin(t)
	rs := testenv.Redis(t, "--requirepass", redisPW)
	gw := testenv.VersitygwWith(t, testenv.VersitygwOptions{AccessKey: accessKey, SecretKey: secretKey}, "tensors")
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	akFile, skFile, wrongSKFile := file("ak", accessKey), file("sk", secretKey), file("wrong-sk", wrongS3)
	pwFile, keyFile := file("redis-pw", redisPW), file("sign", signKey)
	config := func(name, skf string) string {
		return file(name, fmt.Sprintf(`worker: secrets-test
backend: cpu
retry_base: 50ms
retry_max: 200ms
outage_hold: 1s
log_level: debug
redis:
  addr: %s
  password_file: %s
storage:
  s3:
    endpoint: %s
    tls: false
    access_key_file: %s
    secret_key_file: %s
    allow: [{bucket: tensors}]
signing_key_file: %s
`, rs.Addr, pwFile, gw.Endpoint(), akFile, skf, keyFile))
	}
	goodCfg, wrongS3Cfg := config("good.yaml", skFile), config("wrong-s3.yaml", wrongSKFile)
	// Everything the worker wrote or answered, to be searched at the end.
	var seen []string
	keep := func(what, s string) { seen = append(seen, what+":\n"+s) }

	// --print-config, secrets from files, then from the environment (with
	// a password in the Redis URL too).
	for _, c := range []struct {
		name string
		env  []string
	}{
		{"files", cleanEnv()},
		{"env", cleanEnv("RMSGRAD_REDIS_PASSWORD="+redisPW, "RMSGRAD_S3_ACCESS_KEY="+accessKey, "RMSGRAD_S3_SECRET_KEY="+secretKey,
			"RMSGRAD_SIGNING_KEY="+signKey, "RMSGRAD_REDIS_URL=redis://default:"+redisPW+"@"+rs.Addr+"/0")},
	} {
		cmd := exec.Command(bin, "--config", goodCfg, "--print-config")
		cmd.Env = c.env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("--print-config (%s): %v\n%s", c.name, err, out)
		}
		keep("print-config "+c.name, string(out))
		for _, want := range []string{"redis password: <redacted> from", "s3 access key: <redacted> from", "s3 secret key: <redacted> from", "signing key: <redacted> from"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("--print-config (%s) lacks %q:\n%s", c.name, want, out)
			}
		}
		if c.name == "env" && !strings.Contains(string(out), "REDACTED@"+rs.Addr) {
			t.Errorf("--print-config does not show the Redis URL with its password redacted:\n%s", out)
		}
	}
	// Config errors that involve secrets.
	for _, c := range []struct {
		name string
		args []string
		env  []string
	}{
		{"access key without secret key", []string{"--config", goodCfg}, cleanEnv("RMSGRAD_S3_SECRET_KEY=", "RMSGRAD_S3_ACCESS_KEY="+accessKey)},
		{"malformed redis URL with a password", []string{"--config", goodCfg}, cleanEnv("RMSGRAD_REDIS_URL=redis://u:" + redisPW + "@" + rs.Addr + "/notadb")},
		{"redis URL with a bad port and a password", []string{"--config", goodCfg}, cleanEnv("RMSGRAD_REDIS_URL=redis://u:" + redisPW + "@127.0.0.1:notaport")},
	} {
		cfg := c.args
		if c.name == "access key without secret key" {
			// only the access key file is named
			cfg = []string{"--config", file("half.yaml", fmt.Sprintf("storage:\n  s3:\n    endpoint: %s\n    access_key_file: %s\n    allow: [{bucket: tensors}]\n", gw.Endpoint(), akFile))}
		}
		cmd := exec.Command(bin, append(cfg, "--http", "")...)
		cmd.Env = c.env
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("%s: the worker started:\n%s", c.name, out)
			continue
		}
		keep("config error "+c.name, string(out))
		if !strings.Contains(string(out), "config") {
			t.Errorf("%s: error does not name the config: %s", c.name, out)
		}
	}

	// Inputs, uploaded with the real keys.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := s3.New(ctx, s3.Config{Endpoint: gw.Endpoint(), AccessKey: accessKey, SecretKey: secretKey, Allow: []s3.AllowRule{{Bucket: "tensors"}}})
	if err != nil {
		t.Fatal(err)
	}
	admin := storage.NewRouter()
	admin.Register("s3", st)
	in := "s3://tensors/in.safetensors"
	var obj bytes.Buffer
	if err := safetensors.Encode(&obj, []safetensors.Tensor{
		safetensors.F32("x", []int{2, 8}, []float32{1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1}),
		safetensors.F32("w", []int{8}, []float32{1, 1, 1, 1, 2, 2, 2, 2}),
		safetensors.F32("dy", []int{2, 8}, []float32{1, 0, 1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1, 0, 1}),
	}, nil); err != nil {
		t.Fatal(err)
	}
	if err := admin.Put(ctx, in, bytes.NewReader(obj.Bytes()), int64(obj.Len())); err != nil {
		t.Fatal(err)
	}
	job := func(out string) jobs.Job {
		return jobs.Job{X: in + "#x", W: in + "#w", DY: in + "#dy", Out: out, Eps: 1e-6}
	}
	redisOpt := asynq.RedisClientOpt{Addr: rs.Addr, Password: redisPW}
	client := jobs.NewClient(redisOpt, jobs.WithSigningKey([]byte(signKey)), jobs.WithMaxRetry(3), jobs.WithPollInterval(20*time.Millisecond))
	defer client.Close()
	raw := asynq.NewClient(redisOpt)
	defer raw.Close()
	record := func(id string) *jobs.Status {
		s, err := client.Status(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(s)
		keep("job "+id, string(b))
		return s
	}

	// 1. The worker with the right secrets: from files, and the Redis
	// password from the environment instead of its file.
	w := runWorker(t, bin, cleanEnv("RMSGRAD_REDIS_PASSWORD="+redisPW), "--config", goodCfg)
	w.waitReady(t, 200)
	okID, err := client.Enqueue(ctx, job("s3://tensors/out.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	missID, err := client.Enqueue(ctx, jobs.Job{X: "s3://tensors/nothing.safetensors#x", W: in + "#w", DY: in + "#dy", Out: "s3://tensors/o2", Eps: 1e-6})
	if err != nil {
		t.Fatal(err)
	}
	unsigned := job("s3://tensors/o3")
	unsigned.V = jobs.Version
	pl, _ := json.Marshal(unsigned)
	info, err := raw.Enqueue(asynq.NewTask(jobs.TaskType, pl), asynq.Queue(jobs.DefaultQueue), asynq.MaxRetry(3))
	if err != nil {
		t.Fatal(err)
	}
	unsignedID := info.ID
	// A job that puts the worker's own keys into a URI: rejected, and the
	// message must not repeat them.
	smuggle := job("s3://tensors/o4")
	smuggle.X = "s3://" + accessKey + ":" + secretKey + "@" + gw.Endpoint() + "/tensors/in.safetensors#x"
	smuggleID, err := client.Enqueue(ctx, smuggle)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := client.Wait(ctx, okID); err != nil {
		t.Fatalf("good job: %v\n%s", err, w.out.String())
	} else if res.SHA256["dx"] == "" {
		t.Fatalf("good job result %+v", res)
	}
	for _, c := range []struct{ id, want string }{{missID, "not found"}, {unsignedID, "unsigned"}, {smuggleID, "credentials and endpoints come from configuration"}} {
		_, err := client.Wait(ctx, c.id)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("job %s: %v, want a failure saying %q", c.id, err, c.want)
		}
	}
	for _, id := range []string{okID, missID, unsignedID, smuggleID} {
		record(id)
	}
	_, metrics := w.get(t, "/metrics")
	keep("metrics", metrics)
	if !strings.Contains(metrics, "rmsgrad_jobs_bad_signature_total 1") {
		t.Errorf("/metrics does not count the unsigned job:\n%s", grepLines(metrics, "bad_signature"))
	}
	_, ready := w.get(t, "/readyz")
	keep("readyz", ready)
	w.stop(t)
	keep("worker output", w.out.String())
	outObj, err := os.ReadFile(filepath.Join(gw.Root, "tensors", "out.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	keep("output object", string(outObj))

	// 2. A wrong S3 secret (a worker with a stale key in a fleet): not
	// ready (storage), so a job it takes waits at its readiness gate and
	// goes back to the queue, naming the access error, without using up a
	// retry; it is never archived, and a correctly configured worker runs
	// it.
	w2 := runWorker(t, bin, cleanEnv(), "--config", wrongS3Cfg)
	keep("readyz wrong s3", w2.waitReady(t, 503, "storage", "access denied"))
	denied, err := client.Enqueue(ctx, job("s3://tensors/o5"), asynq.MaxRetry(25))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		s := record(denied)
		if s.State == jobs.StateFailed {
			t.Fatalf("a job refused by the storage credentials was archived: %s", s.LastErr)
		}
		if s.Retried != 0 {
			t.Fatalf("a job held by a worker that is not ready used up a retry: retried %d, last error %q", s.Retried, s.LastErr)
		}
		if strings.Contains(s.LastErr, "not ready") && strings.Contains(s.LastErr, "access denied") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job under a wrong S3 secret: state %s, retried %d, last error %q", s.State, s.Retried, s.LastErr)
		}
	}
	_, metrics = w2.get(t, "/metrics")
	keep("metrics wrong s3", metrics)
	w2.stop(t)
	keep("worker output wrong s3", w2.out.String())
	w4 := runWorker(t, bin, cleanEnv(), "--config", goodCfg)
	if _, err := client.Wait(ctx, denied); err != nil {
		t.Fatalf("the job the misconfigured worker could not run: %v\n%s", err, w4.out.String())
	}
	record(denied)
	w4.stop(t)
	keep("worker output after the fix", w4.out.String())

	// 3. A wrong Redis password: the worker says so (and is not ready, or
	// exits), without the password.
	w3 := runWorker(t, bin, cleanEnv("RMSGRAD_REDIS_PASSWORD="+wrongRedis), "--config", goodCfg)
	select {
	case err := <-w3.done:
		if err == nil {
			t.Error("worker with a wrong Redis password exited 0")
		}
	case <-time.After(3 * time.Second):
		keep("readyz wrong redis", w3.waitReady(t, 503, "redis", "WRONGPASS"))
		_ = w3.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-w3.done:
		case <-time.After(30 * time.Second):
		}
	}
	out3 := w3.out.String()
	keep("worker output wrong redis", out3)
	if !strings.Contains(strings.ToLower(out3), "wrongpass") && !strings.Contains(strings.ToLower(out3), "auth") {
		t.Errorf("the worker with a wrong Redis password does not say why:\n%s", out3)
	}

	all := strings.Join(seen, "\n\n")
	for _, s := range secrets {
		if i := strings.Index(all, s); i >= 0 {
			lo, hi := max(0, i-300), min(len(all), i+100)
			t.Errorf("secret %q appears in the worker's output:\n...%s...", s, all[lo:hi])
		}
	}
	t.Logf("searched %d KiB of worker output, answers and results for %d secrets", len(all)>>10, len(secrets))
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
