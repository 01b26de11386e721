package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
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

	"github.com/rmsgrad/rmsgrad/internal/devstate"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// startBinary runs the built worker and waits until /readyz answers 200.
func startBinary(t *testing.T, bin, httpAddr string, args ...string) (*exec.Cmd, *syncBuf) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--http", httpAddr, "--log-level", "warn"}, args...)...)
	logs := &syncBuf{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return cmd, logs
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker not ready: %v\n%s", err, logs.String())
		}
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestWorkerDevMode: --dev needs nothing but the binary.
func TestWorkerDevMode(t *testing.T) {
	bin := buildWorker(t)
	dir := t.TempDir()
	redisAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	httpAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmd, logs := startBinary(t, bin, httpAddr, "--dev", "--dev-redis", redisAddr, "--dev-dir", dir)
	if !strings.Contains(logs.String(), "dev mode: embedded redis on "+redisAddr) {
		t.Fatalf("dev mode does not print its redis address:\n%s", logs.String())
	}
	// The state file the enqueue CLI reads, and the line telling the user.
	// The worker writes it once it serves jobs, which can be just after
	// /readyz first answers 200 (readiness follows the probes).
	st, err := devstate.Read(dir)
	for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		st, err = devstate.Read(dir)
	}
	if err != nil || st.RedisAddr != redisAddr || st.FileRoot != dir || st.HTTPAddr != httpAddr || st.PID != cmd.Process.Pid {
		t.Fatalf("dev state %+v (%v); want redis %s, root %s, http %s, pid %d", st, err, redisAddr, dir, httpAddr, cmd.Process.Pid)
	}
	told := func() bool {
		return strings.Contains(logs.String(), "enqueue --dev-dir "+dir) && strings.Contains(logs.String(), devstate.Path(dir))
	}
	for deadline := time.Now().Add(5 * time.Second); !told() && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
	}
	if !told() {
		t.Fatalf("dev mode does not say how enqueue finds it:\n%s", logs.String())
	}
	router, js := writeInputs(t, dir, 20)
	client := jobs.NewClient(asynq.RedisClientOpt{Addr: redisAddr}, jobs.WithPollInterval(20*time.Millisecond))
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([]string, len(js))
	for i, j := range js {
		var err error
		if ids[i], err = client.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		res, err := client.Wait(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if res.Backend != "cpu" {
			t.Fatalf("dev mode backend %q, want cpu", res.Backend)
		}
		if _, err := router.Head(ctx, js[i].Out+"#dx"); err != nil {
			t.Fatal(err)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dev worker exit: %v", err)
	}
	if _, err := devstate.Read(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stopped dev worker left its state file: %v", err)
	}
}

func buildWorker(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func writeInputs(t *testing.T, dir string, n int) (*storage.Router, []jobs.Job) {
	t.Helper()
	fs, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	router := storage.NewRouter()
	router.Register("file", fs)
	rng := rand.New(rand.NewPCG(1, 2))
	var js []jobs.Job
	for i := 0; i < n; i++ {
		rows, dim := 1+rng.IntN(16), []int{8, 64, 300}[i%3]
		gen := func(k int) []float32 {
			v := make([]float32, k)
			for j := range v {
				v[j] = float32(rng.NormFloat64())
			}
			return v
		}
		in := "file://" + filepath.Join(dir, fmt.Sprintf("in%d.safetensors", i))
		_, err := router.Write(context.Background(), in, []storage.OutTensor{
			safetensors.F32("x", []int{rows, dim}, gen(rows*dim)),
			safetensors.F32("w", []int{dim}, gen(dim)),
			safetensors.F32("dy", []int{rows, dim}, gen(rows*dim)),
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		js = append(js, jobs.Job{X: in + "#x", W: in + "#w", DY: in + "#dy", Eps: 1e-6,
			Out: "file://" + filepath.Join(dir, fmt.Sprintf("out%d.safetensors", i))})
	}
	return router, js
}

// TestWorkerSIGTERMLosesNothing runs the built binary against a real
// redis-server, sends SIGTERM in the middle of the load, requires exit 0,
// restarts it, and requires every job to complete.
func TestWorkerSIGTERMLosesNothing(t *testing.T) {
	bin := buildWorker(t)
	rs := testenv.Redis(t)
	dir := t.TempDir()
	httpAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	const n = 300
	router, js := writeInputs(t, dir, n)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	client := jobs.NewClient(asynq.RedisClientOpt{Addr: rs.Addr}, jobs.WithPollInterval(50*time.Millisecond))
	defer client.Close()
	ids := make([]string, n)
	for i, j := range js {
		var err error
		if ids[i], err = client.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--redis", rs.Addr, "--file-root", dir, "--backend", "cpu"}
	cmd, logs := startBinary(t, bin, httpAddr, args...)
	time.Sleep(100 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("worker after SIGTERM: %v (want exit 0)\n%s", err, logs.String())
	}
	before := 0
	for _, id := range ids {
		if s, err := client.Status(ctx, id); err == nil && s.State == jobs.StateCompleted {
			before++
		}
	}
	t.Logf("%d of %d jobs completed before the SIGTERM exit", before, n)
	cmd2, logs2 := startBinary(t, bin, httpAddr, args...)
	for i, id := range ids {
		res, err := client.Wait(ctx, id)
		if err != nil {
			t.Fatalf("job %d: %v\n%s", i, err, logs2.String())
		}
		if _, err := router.Head(ctx, res.Out+"#dx"); err != nil {
			t.Fatalf("job %d output: %v", i, err)
		}
	}
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{`rmsgrad_jobs_total{outcome="ok"}`, "rmsgrad_batch_jobs_bucket", `rmsgrad_queue_tasks{queue="rmsnorm",state="completed"}`, "rmsgrad_device_busy_seconds_total", `rmsgrad_buffer_pool_bytes{state="pooled"}`, "rmsgrad_buffer_pool_limit_bytes"} {
		if !strings.Contains(string(body), m) {
			t.Fatalf("/metrics lacks %s", m)
		}
	}
	_ = cmd2.Process.Signal(syscall.SIGTERM)
	if err := cmd2.Wait(); err != nil {
		t.Fatalf("second worker exit: %v", err)
	}
}
