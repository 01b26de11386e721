package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/gateway"
	"github.com/rmsgrad/rmsgrad/internal/procattr"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
)

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds the gateway and worker commands once per test run.
func binaries(t *testing.T) (gw, worker string) {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "rmsgrad-gateway-bin"); binErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir+string(filepath.Separator),
			"github.com/rmsgrad/rmsgrad/cmd/gateway", "github.com/rmsgrad/rmsgrad/cmd/worker")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "gateway"), filepath.Join(binDir, "worker")
}

// python returns Debian's python3 with numpy and torch, or skips (fails
// under RMSGRAD_REQUIRE_SERVERS=1, as scripts/test.sh installs them).
func python(t *testing.T) string {
	t.Helper()
	py := os.Getenv("RMSGRAD_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import numpy, torch").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("%s with numpy and torch is needed (apt-get install python3-numpy python3-torch; scripts/test.sh does): %v %s", py, err, out)
		if os.Getenv("RMSGRAD_REQUIRE_SERVERS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

// proc is a started binary with its output.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuf
	done chan struct{}
}

func start(t *testing.T, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), out: &syncBuf{}, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = procattr.Child()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(os.Interrupt)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
	})
	return p
}

// waitReady polls url (a /readyz) until it answers 200.
func waitReady(t *testing.T, hc *http.Client, url string, p *proc) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited: %s", p.cmd.Path, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %v\n%s", url, err, p.out.String())
		}
	}
}

// cleanEnv is the environment without RMSGRAD_ variables.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RMSGRAD_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

func writeFile(t *testing.T, path, s string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runPython runs the client's unit and end-to-end tests and requires every
// end-to-end test to have run (skips only as listed) and passed.
func runPython(t *testing.T, py string, env []string, skips int) {
	t.Helper()
	dir, err := filepath.Abs("../../clients/python")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "-v", "tests.test_safetensors", "tests.test_e2e")
	cmd.Dir = dir
	cmd.Env = append(env, "PYTHONPATH="+dir, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("python:\n%s", out)
	if err != nil {
		t.Fatalf("python tests: %v", err)
	}
	m := regexp.MustCompile(`(?m)^Ran (\d+) tests? `).FindSubmatch(out)
	if m == nil || string(m[1]) == "0" {
		t.Fatalf("python ran no tests")
	}
	if n := bytes.Count(out, []byte("skipped ")); n != skips {
		t.Fatalf("python: %d tests skipped, want %d", n, skips)
	}
}

// checkQueue requires the queue to hold exactly the jobs the Python tests
// say they enqueued: nothing refused went in.
func checkQueue(t *testing.T, redisAddr, idsFile string) {
	t.Helper()
	b, err := os.ReadFile(idsFile)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Fields(string(b))
	slices.Sort(want)
	want = slices.Compact(want)
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: redisAddr})
	defer insp.Close()
	var got []string
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		insp.ListPendingTasks, insp.ListActiveTasks, insp.ListScheduledTasks, insp.ListRetryTasks,
		insp.ListArchivedTasks, insp.ListCompletedTasks,
	} {
		ts, err := list("rmsnorm", asynq.PageSize(10000))
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range ts {
			got = append(got, ti.ID)
		}
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Fatalf("queue holds %d jobs %v,\nthe Python tests enqueued %d: %v", len(got), got, len(want), want)
	}
	t.Logf("queue holds exactly the %d jobs the Python tests enqueued", len(got))
}

const workerS3YAML = `worker: gw-test
backend: cpu
concurrency: 32
http_addr: %s
log_level: warn
retry_base: 50ms
retry_max: 200ms
shutdown_timeout: 30s
signing_key_file: %s
redis:
  addr: %s
storage:
  s3:
    endpoint: %s
    tls: false
    allow:
      - bucket: rmsgrad
`

const gatewayS3YAML = `http_addr: %s
log_level: warn
signing_key_file: %s
tls:
  cert_file: %s
  key_file: %s
auth:
  token_files: [%s]
  reload_interval: 200ms
limits:
  requests_per_s: 1000
  burst: 1000
redis:
  addr: %s
storage:
  s3:
    endpoint: %s
    tls: false
    allow:
      - bucket: rmsgrad
uploads:
  prefix: s3://rmsgrad/uploads/
  expiry: %s
`

// TestPythonClient is the end-to-end test: redis-server, versitygw,
// the built worker and gateway (TLS, token files with two tokens of one
// name, the job-signing key applied by the gateway and required by the
// worker), and Debian's python3 running the client's tests: torch tensors
// through presigned S3 URLs compared with torch autograd in float64, bad
// and rotated tokens, expired presigned URLs, oversized bodies, malformed
// jobs and a taken id, each a JSON error; then the queue must hold exactly
// the jobs the client enqueued.
func TestPythonClient(t *testing.T) {
	py := python(t)
	gwBin, workerBin := binaries(t)
	redis := testenv.Redis(t)
	s3 := testenv.Versitygw(t, "rmsgrad", "foreign")
	tlsf := testenv.NewTLS(t)
	dir := t.TempDir()
	newTok, err := gateway.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	oldTok, _ := gateway.NewToken()
	l1, _ := gateway.TokenLine("ci", newTok)
	l2, _ := gateway.TokenLine("ci", oldTok)
	tokens := writeFile(t, filepath.Join(dir, "tokens"), "# rotation: the old key stays until the clients move\n"+l1+"\n"+l2+"\n")
	sign := writeFile(t, filepath.Join(dir, "signing.key"), "test-signing-key-0123456789")
	env := cleanEnv("RMSGRAD_S3_ACCESS_KEY="+s3.AccessKey, "RMSGRAD_S3_SECRET_KEY="+s3.SecretKey)

	whttp := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	w := start(t, env, workerBin, "--config", writeFile(t, filepath.Join(dir, "worker.yaml"),
		fmt.Sprintf(workerS3YAML, whttp, sign, redis.Addr, s3.Endpoint())))
	waitReady(t, http.DefaultClient, "http://"+whttp+"/readyz", w)

	hcTLS := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsf.ClientConfig()}}
	gaddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	g := start(t, env, gwBin, "--config", writeFile(t, filepath.Join(dir, "gateway.yaml"),
		fmt.Sprintf(gatewayS3YAML, gaddr, sign, tlsf.CertFile, tlsf.KeyFile, tokens, redis.Addr, s3.Endpoint(), "5m")))
	waitReady(t, hcTLS, "https://"+gaddr+"/readyz", g)
	// The short-expiry gateway: plain HTTP, the same tokens.
	saddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	short := strings.Replace(fmt.Sprintf(gatewayS3YAML, saddr, sign, "", "", tokens, redis.Addr, s3.Endpoint(), "1s"),
		"tls:\n  cert_file: \n  key_file: \n", "", 1)
	sg := start(t, env, gwBin, "--config", writeFile(t, filepath.Join(dir, "short.yaml"), short))
	waitReady(t, http.DefaultClient, "http://"+saddr+"/readyz", sg)

	ids := filepath.Join(dir, "ids")
	writeFile(t, ids, "")
	runPython(t, py, cleanEnv(
		"RMSGRAD_GATEWAY=https://"+gaddr, "RMSGRAD_TOKEN="+newTok, "RMSGRAD_TOKEN_OLD="+oldTok,
		"RMSGRAD_CA_FILE="+tlsf.CAFile, "RMSGRAD_TEST_MODE=s3", "RMSGRAD_TEST_PREFIX=s3://rmsgrad/py/",
		"RMSGRAD_TEST_FOREIGN=s3://foreign/out.safetensors", "RMSGRAD_TEST_SHORT_GATEWAY=http://"+saddr,
		"RMSGRAD_TEST_IDS_FILE="+ids), 0)
	checkQueue(t, redis.Addr, ids)

	// Nothing secret left the gateway: its logs hold neither token nor key.
	for _, s := range []string{newTok, oldTok, s3.SecretKey, "test-signing-key"} {
		if strings.Contains(g.out.String(), s) || strings.Contains(sg.out.String(), s) {
			t.Fatalf("a gateway logged a secret")
		}
	}
	// A token file rewritten without the old token: the gateway drops it
	// within reload_interval.
	writeFile(t, tokens, l1+"\n")
	waitFor(t, 10*time.Second, func() bool {
		req, _ := http.NewRequest("GET", "https://"+gaddr+"/v1/jobs/x", nil)
		req.Header.Set("Authorization", "Bearer "+oldTok)
		resp, err := hcTLS.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized
	})
}

const devGatewayYAML = `uploads:
  max_bytes: 1048576
  expiry: %s
`

// TestPythonDev is the zero-setup mode: `worker --dev` and `gateway --dev`
// (the built binaries, nothing else running), the client's tests in dev
// mode (uploads into the gateway's file store, its expired URLs and upload
// limit), and the quick start example.
func TestPythonDev(t *testing.T) {
	py := python(t)
	gwBin, workerBin := binaries(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	redisAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	whttp := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	env := cleanEnv()
	w := start(t, env, workerBin, "--dev", "--dev-redis", redisAddr, "--dev-dir", data, "--http", whttp, "--log-level", "warn")
	waitReady(t, http.DefaultClient, "http://"+whttp+"/readyz", w)
	gaddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	g := start(t, env, gwBin, "--dev", "--dev-redis", redisAddr, "--dev-dir", data, "--http", gaddr,
		"--config", writeFile(t, filepath.Join(dir, "g.yaml"), fmt.Sprintf(devGatewayYAML, "5m")))
	waitReady(t, http.DefaultClient, "http://"+gaddr+"/readyz", g)
	saddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	sg := start(t, env, gwBin, "--dev", "--dev-redis", redisAddr, "--dev-dir", data, "--http", saddr,
		"--config", writeFile(t, filepath.Join(dir, "s.yaml"), fmt.Sprintf(devGatewayYAML, "1s")))
	waitReady(t, http.DefaultClient, "http://"+saddr+"/readyz", sg)

	ids := filepath.Join(dir, "ids")
	writeFile(t, ids, "")
	pyEnv := cleanEnv("RMSGRAD_GATEWAY=http://"+gaddr, "RMSGRAD_TEST_MODE=dev",
		"RMSGRAD_TEST_PREFIX=file://"+data+"/py/", "RMSGRAD_TEST_FOREIGN=file:///tmp/elsewhere.safetensors",
		"RMSGRAD_TEST_SHORT_GATEWAY=http://"+saddr, "RMSGRAD_TEST_MAX_UPLOAD=1048576", "RMSGRAD_TEST_IDS_FILE="+ids)
	runPython(t, py, pyEnv, 1) // test_tokens: no tokens on a dev gateway
	checkQueue(t, redisAddr, ids)

	dirPy, _ := filepath.Abs("../../clients/python")
	cmd := exec.Command(py, filepath.Join(dirPy, "examples", "quickstart.py"))
	cmd.Env = append(pyEnv, "PYTHONPATH="+dirPy)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("quickstart: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), "max relative error"); n != 3 {
		t.Fatalf("quickstart printed %d results, want 3:\n%s", n, out)
	}
	t.Logf("quickstart:\n%s", out)
}

func waitFor(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
