package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/internal/devstate"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// runIn runs the built enqueue binary in dir with no RMSGRAD_ variable of
// the caller's, plus env.
func runIn(t *testing.T, dir string, env []string, args ...string) cliResult {
	t.Helper()
	_, bin := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RMSGRAD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := cliResult{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("enqueue %v: %v", args, err)
	}
	return r
}

// TestUsageAndExitCodes: --help of the program and of every command is
// usage on stdout and exit 0; bad usage is exit 2 with the message on
// stderr.
func TestUsageAndExitCodes(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args     []string
		code     int
		out, err string
	}{
		{[]string{"--help"}, 0, "usage: enqueue <command>", ""},
		{[]string{"help"}, 0, "commands:", ""},
		{[]string{"submit", "--help"}, 0, "usage: enqueue submit --x X --w W --dy DY --out OUT", ""},
		{[]string{"synth", "-h"}, 0, "-shape", ""},
		{[]string{"wait", "--help"}, 0, "usage: enqueue wait", ""},
		{[]string{"status", "--help"}, 0, "usage: enqueue status", ""},
		{[]string{"result", "-h"}, 0, "usage: enqueue result", ""},
		{nil, 2, "", "usage: enqueue <command>"},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"submit", "--bogus"}, 2, "", "flag provided but not defined: -bogus"},
		{[]string{"submit", "--x", "a"}, 2, "", "--w is required"},
		{[]string{"synth", "--shape", "8by1024"}, 2, "", `"8by1024" is not ROWSxDIM`},
		{[]string{"status"}, 2, "", "want exactly one job id, got 0"},
		{[]string{"wait"}, 2, "", "no job ids given"},
	} {
		r := runIn(t, dir, nil, c.args...)
		if r.code != c.code || !strings.Contains(r.stdout, c.out) || !strings.Contains(r.stderr, c.err) {
			t.Errorf("enqueue %q: exit %d\nstdout %q\nstderr %q\nwant exit %d, %q on stdout, %q on stderr", c.args, r.code, r.stdout, r.stderr, c.code, c.out, c.err)
		}
		if c.code == 0 && r.stderr != "" {
			t.Errorf("enqueue %q: help wrote to stderr: %q", c.args, r.stderr)
		}
		if strings.Count(r.stderr, "flag provided but not defined") > 1 {
			t.Errorf("enqueue %q: the error is printed twice: %q", c.args, r.stderr)
		}
	}
}

// TestSubmitChecksFirst: what the command line and the local disk can tell
// is reported before Redis is contacted (here Redis is a closed port, so
// a check that came later would read "cannot reach Redis"), each message
// saying what to type instead. And a Redis error names the config file the
// address came from.
func TestSubmitChecksFirst(t *testing.T) {
	work := t.TempDir()
	root := filepath.Join(work, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	here := filepath.Join(work, "here.safetensors")
	writeLocal(t, here, safetensors.F32("x", []int{2, 8}, computetest.Uniform(1, 16, 1)))
	inRoot := filepath.Join(root, "in.safetensors")
	writeLocal(t, inRoot, safetensors.F32("x", []int{2, 8}, computetest.Uniform(1, 16, 1)))
	closed := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	args := func(x, out string, extra ...string) []string {
		return append([]string{"submit", "--redis", closed, "--x", x, "--w", "s3://b/w.safetensors", "--dy", "s3://b/dy.safetensors", "--out", out}, extra...)
	}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"out with #name", args("s3://b/x.safetensors", "s3://b/out.safetensors#dx"),
			[]string{`--out s3://b/out.safetensors#dx: an output names an object, not a tensor: drop "#dx"`, "e.g. --out s3://b/out.safetensors"}},
		{"out a local path, no root", args("s3://b/x.safetensors", "grads.safetensors"),
			[]string{"--out grads.safetensors: a local path, and no file store root is configured (storage.file_root, RMSGRAD_FILE_ROOT, --root)", "--out s3://BUCKET/run1/grads.safetensors"}},
		{"out a local path outside the root", args("s3://b/x.safetensors", "grads.safetensors", "--root", root),
			[]string{"outside the file store root " + root, "--out " + filepath.Join(root, "grads.safetensors")}},
		{"out not a URI", args("s3://b/x.safetensors", "s3:/b/out"),
			[]string{"--out", "a local path"}},
		{"input missing, no root", args("missing.safetensors", "s3://b/o.safetensors"),
			[]string{"--x missing.safetensors: no such file"}},
		{"input missing under the root", args(filepath.Join(root, "nope.safetensors")+"#x", "s3://b/o.safetensors", "--root", root),
			[]string{"--x " + filepath.Join(root, "nope.safetensors") + "#x: no such file"}},
		{"input outside the root", args(here, "s3://b/o.safetensors", "--root", root),
			[]string{"--x " + here + ": outside the file store root " + root, "storage.upload_prefix (RMSGRAD_UPLOAD_PREFIX, --upload-prefix)"}},
		{"input local, no root and no upload prefix", args(here, "s3://b/o.safetensors"),
			[]string{"neither a file store root nor an upload prefix is configured", "start worker --dev in this directory"}},
		{"input URI malformed", args("s3://b/../x", "s3://b/o.safetensors"),
			[]string{"--x:", "invalid tensor URI"}},
	} {
		r := runIn(t, work, nil, c.args...)
		if r.code != 1 || strings.Contains(r.stderr, "Redis") {
			t.Errorf("%s: exit %d, stderr %q: want exit 1 before Redis is contacted", c.name, r.code, r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: stderr %q lacks %q", c.name, r.stderr, w)
			}
		}
	}
	// Past the checks, Redis: the error names where the address came from
	// and the config file actually read.
	cfg := filepath.Join(work, "mine.yaml")
	writeFile(t, cfg, "redis:\n  addr: "+closed+"\n")
	r := runIn(t, work, []string{"RMSGRAD_ENQUEUE_CONFIG=" + cfg}, "submit", "--x", inRoot, "--w", "s3://b/w.safetensors",
		"--dy", "s3://b/dy.safetensors", "--out", "s3://b/o.safetensors", "--root", root)
	want := "cannot reach Redis at " + closed + " (from redis.addr in " + cfg + "; set --redis, RMSGRAD_REDIS_ADDR or redis.addr in " + cfg
	if r.code != 1 || !strings.Contains(r.stderr, want) || strings.Contains(r.stderr, "configs/enqueue.yaml") {
		t.Errorf("Redis down, address from RMSGRAD_ENQUEUE_CONFIG: exit %d, stderr %q; want %q", r.code, r.stderr, want)
	}
}

// TestDevWorkerWithoutFlags is the README's first job: worker --dev and
// enqueue run from one directory find each other with no flag, local files
// are used in place under the dev directory or copied into it, and --out
// may be a path under it. A stale state file and a --dev-dir with no
// worker are reported as such.
func TestDevWorkerWithoutFlags(t *testing.T) {
	workerBin, _ := binaries(t)
	work := t.TempDir()
	dev := filepath.Join(work, "rmsgrad-dev")
	worker := exec.Command(workerBin, "--dev", "--dev-redis", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-level", "warn")
	worker.Dir = work
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RMSGRAD_") {
			worker.Env = append(worker.Env, kv)
		}
	}
	logs := &syncBuf{}
	worker.Stdout, worker.Stderr = logs, logs
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = worker.Process.Kill(); _ = worker.Wait() })
	var st devstate.State
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if st, err = devstate.Read(dev); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s: %v\n%s", devstate.Path(dev), err, logs.String())
		}
	}

	xShape := []int{3, 40}
	x, w, dy := computetest.Uniform(51, 120, 1), computetest.Uniform(52, 40, 1), computetest.Uniform(53, 120, 1)
	writeLocal(t, filepath.Join(work, "in.safetensors"), safetensors.F32("x", xShape, x), safetensors.F32("w", []int{40}, w),
		safetensors.F32("dy", xShape, dy))
	fs, err := file.New(dev)
	if err != nil {
		t.Fatal(err)
	}
	router := storage.NewRouter()
	router.Register("file", fs)
	check := &cliEnv{t: t, router: router}
	submit := func(in, out string) cliResult {
		t.Helper()
		return runIn(t, work, nil, "submit", "--x", in+"#x", "--w", in+"#w", "--dy", in+"#dy", "--out", out, "--wait", "--json")
	}
	completed := func(r cliResult) *jobs.Result {
		t.Helper()
		var v struct {
			State  string       `json:"state"`
			Result *jobs.Result `json:"result"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != 0 || v.State != "completed" {
			t.Fatalf("submit: exit %d, stdout %q, stderr %q (%v)\nworker: %s", r.code, r.stdout, r.stderr, err, logs.String())
		}
		return v.Result
	}

	// A file outside the dev directory is copied into it first.
	r := submit("in.safetensors", "rmsgrad-dev/grads.safetensors")
	res := completed(r)
	if res.Out != "file://"+filepath.Join(dev, "grads.safetensors") {
		t.Fatalf("out %q: want the local path made a file:// URI under the dev directory", res.Out)
	}
	if err := check.checkOutputs(res, x, w, dy, xShape, 1e-6, "dx", "dw"); err != nil {
		t.Fatal(err)
	}
	ups, _ := os.ReadDir(filepath.Join(dev, "uploads"))
	if len(ups) != 1 || !strings.HasSuffix(ups[0].Name(), "-in.safetensors") {
		t.Fatalf("uploads: %v, want the one input file", ups)
	}
	if r.stderr != "" {
		t.Errorf("submit to a running dev worker printed %q on stderr", r.stderr)
	}
	// A file under the dev directory is used where it is.
	data, err := os.ReadFile(filepath.Join(work, "in.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dev, "mine.safetensors"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	res = completed(submit("rmsgrad-dev/mine.safetensors", "rmsgrad-dev/grads2.safetensors"))
	if err := check.checkOutputs(res, x, w, dy, xShape, 1e-6, "dx", "dw"); err != nil {
		t.Fatal(err)
	}
	if ups, _ := os.ReadDir(filepath.Join(dev, "uploads")); len(ups) != 1 {
		t.Fatalf("a file under the dev directory was uploaded: %v", ups)
	}
	// --pin-w: the pin the CLI computes is w's (the job would fail
	// otherwise), twice, the second from the worker's pin cache; a wrong
	// --w-sha256 fails the job, naming both digests.
	for i, out := range []string{"rmsgrad-dev/pinned1.safetensors", "rmsgrad-dev/pinned2.safetensors"} {
		r := runIn(t, work, nil, "submit", "--x", "rmsgrad-dev/mine.safetensors#x", "--w", "rmsgrad-dev/mine.safetensors#w",
			"--dy", "rmsgrad-dev/mine.safetensors#dy", "--out", out, "--pin-w", "--wait", "--json")
		res := completed(r)
		if err := check.checkOutputs(res, x, w, dy, xShape, 1e-6, "dx", "dw"); err != nil {
			t.Fatalf("pinned job %d: %v", i, err)
		}
	}
	wrong := strings.Repeat("0", 64)
	r = runIn(t, work, nil, "submit", "--x", "rmsgrad-dev/mine.safetensors#x", "--w", "rmsgrad-dev/mine.safetensors#w",
		"--dy", "rmsgrad-dev/mine.safetensors#dy", "--out", "rmsgrad-dev/pinned3.safetensors", "--w-sha256", wrong, "--wait")
	if r.code != 1 || !strings.Contains(r.stdout+r.stderr, "does not match the job's w_sha256") || !strings.Contains(r.stdout+r.stderr, wrong) {
		t.Errorf("wrong --w-sha256: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := runIn(t, work, nil, "submit", "--x", "a", "--w", "b", "--dy", "c", "--out", "d", "--pin-w", "--w-sha256", wrong); r.code != 2 || !strings.Contains(r.stderr, "give one") {
		t.Errorf("--pin-w with --w-sha256: exit %d, stderr %q", r.code, r.stderr)
	}
	// A tensor name the file does not hold: reported before enqueuing,
	// listing the names it does hold.
	r = runIn(t, work, nil, "submit", "--x", "in.safetensors#x", "--w", "in.safetensors#weight", "--dy", "in.safetensors#dy",
		"--out", "rmsgrad-dev/g3.safetensors")
	if r.code != 1 || !strings.Contains(r.stderr, "--w:") || !strings.Contains(r.stderr, "weight") || !strings.Contains(r.stderr, "nothing was enqueued") {
		t.Errorf("missing tensor name: exit %d, stderr %q", r.code, r.stderr)
	}
	// --out outside the dev directory: the message gives the path to use.
	r = runIn(t, work, nil, "submit", "--x", "in.safetensors#x", "--w", "in.safetensors#w", "--dy", "in.safetensors#dy", "--out", "g4.safetensors")
	if r.code != 1 || !strings.Contains(r.stderr, "--out "+filepath.Join(dev, "g4.safetensors")) {
		t.Errorf("--out outside the dev directory: exit %d, stderr %q", r.code, r.stderr)
	}
	// Named from elsewhere with --dev-dir, and through RMSGRAD_DEV_DIR.
	elsewhere := t.TempDir()
	if r := runIn(t, elsewhere, nil, "status", "--dev-dir", dev, "no-such-job"); r.code != 1 || !strings.Contains(r.stderr, "job not found") {
		t.Errorf("status --dev-dir from another directory: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runIn(t, elsewhere, []string{devstate.EnvDir + "=" + dev}, "status", "no-such-job"); r.code != 1 || !strings.Contains(r.stderr, "job not found") {
		t.Errorf("status with %s: exit %d, stderr %q", devstate.EnvDir, r.code, r.stderr)
	}
	if r := runIn(t, elsewhere, nil, "status", "--dev-dir", elsewhere, "x"); r.code != 1 || !strings.Contains(r.stderr, "no dev worker in "+elsewhere) {
		t.Errorf("--dev-dir without a worker: exit %d, stderr %q", r.code, r.stderr)
	}

	// A dev worker killed without its clean-up leaves the file: the CLI
	// says where the address came from and asks whether it still runs.
	if err := worker.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = worker.Wait()
	r = runIn(t, work, nil, "status", "x")
	want := fmt.Sprintf("cannot reach Redis at %s (from the dev worker's state file %s: is that dev worker, pid %d, still running?",
		st.RedisAddr, filepath.Join("rmsgrad-dev", devstate.FileName), st.PID)
	if r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Errorf("stale state file: exit %d, stderr %q, want %q", r.code, r.stderr, want)
	}
}
