package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// The bucket the worker and the CLI may use, and one that exists on the
// gateway but is on nobody's allow-list.
const (
	bucket        = "rmsgrad"
	foreignBucket = "foreign"
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

// binaries builds bin/worker and bin/enqueue once per test run, exactly as
// make build does, and returns their paths.
func binaries(t *testing.T) (worker, enqueue string) {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "rmsgrad-cli-bin")
		if binErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir+string(filepath.Separator),
			"github.com/rmsgrad/rmsgrad/cmd/worker", "github.com/rmsgrad/rmsgrad/cmd/enqueue")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "worker"), filepath.Join(binDir, "enqueue")
}

// cliEnv is a real redis-server, a real versitygw, a built worker running
// against both, and a place to run the built enqueue binary from.
type cliEnv struct {
	t        *testing.T
	redis    *testenv.Server
	s3       *testenv.S3
	enqueue  string
	work     string // enqueue's working directory and config
	router   *storage.Router
	client   *jobs.Client
	worker   *exec.Cmd
	logs     *syncBuf
	httpAddr string
}

// workerYAML is the worker's configuration in these tests: the real S3
// store with an allow-list, short retries, and a max_wait long enough that
// concurrent jobs share command buffers on a loaded machine.
const workerYAML = `worker: cli-test
backend: cpu
concurrency: 64
http_addr: %s
log_level: warn
retry_base: 50ms
retry_max: 200ms
shutdown_timeout: 30s
batch:
  max_jobs: 32
  max_wait: 20ms
redis:
  addr: %s
storage:
  s3:
    endpoint: %s
    tls: false
    allow:
      - bucket: ` + bucket + `
`

const enqueueYAML = `redis:
  addr: %s
storage:
  upload_prefix: s3://` + bucket + `/uploads/
  s3:
    endpoint: %s
    tls: false
    buckets: [` + bucket + `]
`

func newCLIEnv(t *testing.T) *cliEnv {
	t.Helper()
	t0 := time.Now()
	workerBin, enqueueBin := binaries(t)
	t.Logf("built in %v", time.Since(t0))
	e := &cliEnv{t: t, redis: testenv.Redis(t), s3: testenv.Versitygw(t, bucket, foreignBucket),
		enqueue: enqueueBin, work: t.TempDir()}
	e.httpAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	wcfg := filepath.Join(e.work, "worker.yaml")
	writeFile(t, wcfg, fmt.Sprintf(workerYAML, e.httpAddr, e.redis.Addr, e.s3.Endpoint()))
	writeFile(t, filepath.Join(e.work, "enqueue.yaml"), fmt.Sprintf(enqueueYAML, e.redis.Addr, e.s3.Endpoint()))

	st, err := s3.New(context.Background(), s3.Config{Endpoint: e.s3.Endpoint(), AccessKey: e.s3.AccessKey,
		SecretKey: e.s3.SecretKey, Region: "us-east-1", Allow: []s3.AllowRule{{Bucket: bucket}}})
	if err != nil {
		t.Fatal(err)
	}
	e.router = storage.NewRouter()
	e.router.Register("s3", st)
	e.client = jobs.NewClient(asynq.RedisClientOpt{Addr: e.redis.Addr}, jobs.WithMaxRetry(3), jobs.WithPollInterval(50*time.Millisecond))
	t.Cleanup(func() { e.client.Close() })

	e.worker = exec.Command(workerBin, "--config", wcfg)
	e.worker.Env = e.environ()
	e.logs = &syncBuf{}
	e.worker.Stdout, e.worker.Stderr = e.logs, e.logs
	if err := e.worker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if e.worker.ProcessState == nil {
			_ = e.worker.Process.Kill()
			_ = e.worker.Wait()
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + e.httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker not ready: %v\n%s", err, e.logs.String())
		}
	}
	t.Logf("servers and worker up in %v", time.Since(t0))
	return e
}

// environ is the process environment without any RMSGRAD_ setting of the
// caller's, plus the S3 credentials (the only way secrets reach either
// binary) and the enqueue config.
func (e *cliEnv) environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RMSGRAD_") {
			env = append(env, kv)
		}
	}
	return append(env, "RMSGRAD_S3_ACCESS_KEY="+e.s3.AccessKey, "RMSGRAD_S3_SECRET_KEY="+e.s3.SecretKey,
		"RMSGRAD_ENQUEUE_CONFIG="+filepath.Join(e.work, "enqueue.yaml"))
}

// stopWorker sends SIGTERM and requires exit status 0.
func (e *cliEnv) stopWorker() {
	e.t.Helper()
	if err := e.worker.Process.Signal(syscall.SIGTERM); err != nil {
		e.t.Fatal(err)
	}
	if err := e.worker.Wait(); err != nil {
		e.t.Fatalf("worker after SIGTERM: %v (want exit 0)\n%s", err, e.logs.String())
	}
}

// cliResult is one run of the enqueue binary.
type cliResult struct {
	stdout, stderr string
	code           int
}

// run runs the built enqueue binary the way a user would.
func (e *cliEnv) run(args ...string) cliResult {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.enqueue, args...)
	cmd.Dir = e.work
	cmd.Env = e.environ()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := cliResult{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		e.t.Fatalf("enqueue %v: %v", args, err)
	}
	return r
}

func (e *cliEnv) mustRun(args ...string) cliResult {
	e.t.Helper()
	r := e.run(args...)
	if r.code != 0 {
		e.t.Fatalf("enqueue %v: exit %d\nstdout: %s\nstderr: %s\nworker: %s", args, r.code, r.stdout, r.stderr, e.logs.String())
	}
	return r
}

// put writes tensors as one safetensors object at uri.
func (e *cliEnv) put(uri string, ts ...storage.OutTensor) {
	e.t.Helper()
	if _, err := e.router.Write(context.Background(), uri, ts, nil); err != nil {
		e.t.Fatal(err)
	}
}

// read returns a tensor's shape and values.
func (e *cliEnv) read(uri string) ([]int, []float32, []byte) {
	e.t.Helper()
	ti, err := e.router.Head(context.Background(), uri)
	if err != nil {
		e.t.Fatalf("read %s: %v", uri, err)
	}
	b := make([]byte, ti.Size)
	if err := e.router.Fetch(context.Background(), ti, b); err != nil {
		e.t.Fatalf("read %s: %v", uri, err)
	}
	return ti.Shape, f32s(b), b
}

// checkOutputs reads job outputs back from S3 and checks them: every
// requested tensor present with its shape, its sha256 equal to the
// result's, and its values equal to the float64 oracle's at the
// conformance suite's tolerance. x, w, dy are the job's inputs.
func (e *cliEnv) checkOutputs(res *jobs.Result, x, w, dy []float32, xShape []int, eps float64, outputs ...string) error {
	dim := xShape[len(xShape)-1]
	rows := len(x) / dim
	if res.Rows != rows || res.Dim != dim {
		return fmt.Errorf("result rows %d dim %d, want %d and %d", res.Rows, res.Dim, rows, dim)
	}
	wantR, wantDX, wantDW := computetest.Oracle(x, w, dy, rows, dim, eps)
	if len(res.SHA256) != len(outputs) {
		return fmt.Errorf("result sha256 has %v, want exactly %v", res.SHA256, outputs)
	}
	for _, name := range outputs {
		ti, err := e.router.Head(context.Background(), res.Out+"#"+name)
		if err != nil {
			return err
		}
		b := make([]byte, ti.Size)
		if err := e.router.Fetch(context.Background(), ti, b); err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != res.SHA256[name] {
			return fmt.Errorf("%s: sha256 %s, result says %s", name, got, res.SHA256[name])
		}
		got := f32s(b)
		switch name {
		case "dx":
			if !equalInts(ti.Shape, xShape) {
				return fmt.Errorf("dx shape %v, want x's %v", ti.Shape, xShape)
			}
			err = computetest.CompareDX(got, wantDX, x, w, dy, rows, dim, eps)
		case "dw":
			if !equalInts(ti.Shape, []int{dim}) {
				return fmt.Errorf("dw shape %v, want [%d]", ti.Shape, dim)
			}
			err = computetest.Compare("dw", got, wantDW, rows, dim)
		case "r":
			if !equalInts(ti.Shape, []int{rows}) {
				return fmt.Errorf("r shape %v, want [%d]", ti.Shape, rows)
			}
			err = computetest.Compare("r", got, wantR, rows, dim)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func f32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
