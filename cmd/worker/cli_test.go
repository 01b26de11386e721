package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

	"github.com/rmsgrad/rmsgrad/internal/devstate"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
)

// runBinary runs the built worker to completion and returns its exit code.
func runBinary(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("worker %q: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// TestWorkerExitCodes: --help is not an error (usage on stdout, exit 0);
// bad usage is exit 2 with the flags on stderr; a bad configuration is
// exit 1 naming the key and its variable.
func TestWorkerExitCodes(t *testing.T) {
	bin := buildWorker(t)
	for _, c := range []struct {
		args       []string
		code       int
		out, err   string
		emptyOther bool
		flags      bool // the usage follows the error on stderr
	}{
		{args: []string{"--help"}, code: 0, out: "usage: worker [flags]", emptyOther: true},
		{args: []string{"-h"}, code: 0, out: "-print-config", emptyOther: true},
		{args: []string{"--no-such-flag"}, code: 2, err: "flag provided but not defined: -no-such-flag", flags: true},
		{args: []string{"--concurrency", "x"}, code: 2, err: "invalid value", flags: true},
		{args: []string{"stray"}, code: 2, err: `unexpected arguments ["stray"]`},
	} {
		out, errs, code := runBinary(t, bin, c.args...)
		if code != c.code || !strings.Contains(out, c.out) || !strings.Contains(errs, c.err) {
			t.Errorf("worker %q: exit %d, stdout %q, stderr %q; want exit %d, %q on stdout, %q on stderr", c.args, code, out, errs, c.code, c.out, c.err)
		}
		if c.emptyOther && errs != "" {
			t.Errorf("worker %q: stderr %q, want nothing", c.args, errs)
		}
		if c.flags && !strings.Contains(errs, "-dev-dir") {
			t.Errorf("worker %q: a usage error lists the flags on stderr: %q", c.args, errs)
		}
	}
	cfg := writeFile(t, "w.yaml", "budget_bytes: 0\n")
	_, errs, code := runBinary(t, bin, "--config", cfg)
	if code != 1 || !strings.Contains(errs, "budget_bytes (RMSGRAD_BUDGET_BYTES): must be > 0") {
		t.Errorf("budget_bytes 0: exit %d, stderr %q; want exit 1 naming the key and its variable", code, errs)
	}
}

// TestPrintConfigIsEffective: --print-config shows what the worker runs
// with: defaults filled in (the S3 upload sizes, not 0) and, under --dev,
// the embedded Redis, the dev directory as the file root and cpu for auto.
func TestPrintConfigIsEffective(t *testing.T) {
	print := func(args []string, e map[string]string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(append(args, "--print-config"), env(e), &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	s := print(nil, nil)
	for _, want := range []string{"multipart_threshold: 134217728", "part_size: 16777216", "addr: 127.0.0.1:6379",
		"backend: auto", "file_root: \"\"", "# procs 0: Go's default, GOMAXPROCS"} {
		if !strings.Contains(s, want) {
			t.Errorf("--print-config lacks %q:\n%s", want, s)
		}
	}
	dir := t.TempDir()
	file := writeFile(t, "w.yaml", "redis:\n  addr: prod-redis:6379\nstorage:\n  file_root: /srv/tensors\n")
	s = print([]string{"--config", file, "--dev", "--dev-dir", dir, "--dev-redis", "127.0.0.1:0"},
		map[string]string{"RMSGRAD_REDIS_PASSWORD": "prod-password"})
	for _, want := range []string{"addr: 127.0.0.1:0", "file_root: " + dir, "backend: cpu", "enabled: true",
		"# dev mode: redis.addr is the worker's embedded Redis-protocol server (dev.redis_addr; port 0: a free port chosen at start)",
		devstate.Path(dir), "redis password: not set"} {
		if !strings.Contains(s, want) {
			t.Errorf("--dev --print-config lacks %q:\n%s", want, s)
		}
	}
	for _, not := range []string{"prod-redis", "/srv/tensors", "prod-password"} {
		if strings.Contains(s, not) {
			t.Errorf("--dev --print-config shows %q, which dev mode does not use:\n%s", not, s)
		}
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("--print-config wrote into the dev directory: %v", ents)
	}
}

// logLine is the part of a worker log line the tests look at.
type logLine struct {
	Level     string `json:"level"`
	Msg       string `json:"msg"`
	Component string `json:"component"`
	TaskID    string `json:"task_id"`
	Outcome   string `json:"outcome"`
	Err       string `json:"err"`
}

// parseLog requires every line of a worker's stderr to be a JSON object.
func parseLog(t *testing.T, stderr string) []logLine {
	t.Helper()
	var out []logLine
	for i, s := range strings.Split(strings.TrimRight(stderr, "\n"), "\n") {
		var l logLine
		if err := json.Unmarshal([]byte(s), &l); err != nil || l.Level == "" || l.Msg == "" {
			t.Fatalf("stderr line %d is not a JSON log line: %q (%v)", i+1, s, err)
		}
		out = append(out, l)
	}
	return out
}

// TestLogStreamIsJSON runs the built worker against a real redis-server,
// feeds it a good job and a bad one, SIGKILLs Redis for a few seconds and
// brings it back, then stops the worker: every line it wrote to stderr
// must be JSON (go-redis's and asynq's lines included), the bad job must
// be logged once, at info, and asynq's "Retry exhausted" warning must not
// appear.
func TestLogStreamIsJSON(t *testing.T) {
	bin := buildWorker(t)
	rs := testenv.Redis(t)
	dir := t.TempDir()
	_, js := writeInputs(t, dir, 2)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmd := exec.Command(bin, "--redis", rs.Addr, "--file-root", dir, "--backend", "cpu", "--http", httpAddr, "--log-level", "info")
	var stdout bytes.Buffer
	stderr := &syncBuf{}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitReady := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			resp, err := http.Get("http://" + httpAddr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == want {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz never answered %d: %v\n%s", want, err, stderr.String())
			}
		}
	}
	waitReady(200)

	client := jobs.NewClient(asynq.RedisClientOpt{Addr: rs.Addr}, jobs.WithMaxRetry(3), jobs.WithPollInterval(20*time.Millisecond))
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	good, err := client.Enqueue(ctx, js[0])
	if err != nil {
		t.Fatal(err)
	}
	bad := js[1]
	bad.DY = "file://" + filepath.Join(dir, "missing.safetensors") + "#dy"
	badID, err := client.Enqueue(ctx, bad)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Wait(ctx, good); err != nil {
		t.Fatal(err)
	}
	var failed *jobs.JobFailedError
	if _, err := client.Wait(ctx, badID); !errors.As(err, &failed) || failed.Retried != 0 {
		t.Fatalf("bad job: %v, want a permanent failure", err)
	}

	// Redis goes away: the worker logs the outage (its own probe, asynq,
	// go-redis), and must stay a JSON stream.
	rs.Kill()
	waitReady(503)
	time.Sleep(3 * time.Second)
	rs.Start()
	waitReady(200)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("worker after SIGTERM: %v\n%s", err, stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("the worker wrote to stdout outside dev mode: %q", stdout.String())
	}

	lines := parseLog(t, stderr.String())
	var badLines, redisLines, down []logLine
	for _, l := range lines {
		if l.TaskID == badID || strings.Contains(l.Msg, badID) {
			badLines = append(badLines, l)
		}
		if l.Component == "go-redis" {
			redisLines = append(redisLines, l)
		}
		if l.Msg == "dependency down: not ready" {
			down = append(down, l)
		}
		if strings.Contains(l.Msg, "Retry exhausted") && l.Level != "DEBUG" {
			t.Errorf("asynq's Retry exhausted logged at %s: %+v", l.Level, l)
		}
	}
	if len(badLines) != 1 || badLines[0].Level != "INFO" || badLines[0].Msg != "job rejected" || badLines[0].Outcome != "permanent" ||
		!strings.Contains(badLines[0].Err, "missing.safetensors") {
		t.Errorf("the bad job's log lines: %+v; want one INFO \"job rejected\" naming the missing input", badLines)
	}
	if len(down) == 0 || down[0].Level != "WARN" {
		t.Errorf("the Redis outage was not logged as a WARN dependency down: %+v", down)
	}
	t.Logf("%d JSON lines, %d of them from go-redis", len(lines), len(redisLines))
	if len(redisLines) == 0 {
		t.Errorf("no go-redis line during a Redis outage: the test did not see the stream it checks")
	}
	for _, l := range redisLines {
		if l.Level != "WARN" && l.Level != "ERROR" {
			t.Errorf("go-redis line at %s: %+v", l.Level, l)
		}
	}
}
