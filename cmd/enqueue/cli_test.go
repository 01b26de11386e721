package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// writeLocal writes one safetensors file on local disk, as a user's tensor
// file would be.
func writeLocal(t *testing.T, path string, ts ...safetensors.Tensor) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := safetensors.Encode(f, ts, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func uploads(t *testing.T, e *cliEnv) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.s3.Root, bucket, "uploads"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	return names
}

// TestCLI runs the built enqueue binary as a user would, against a real
// redis-server, a real versitygw and the built worker.
func TestCLI(t *testing.T) {
	e := newCLIEnv(t)
	local := t.TempDir()

	// Inputs of a [2, 3, 64] job ([batch, seq, D]: rows = 6).
	xShape := []int{2, 3, 64}
	x := computetest.Uniform(11, 6*64, 1)
	w := computetest.Uniform(12, 64, 0.5)
	dy := computetest.Uniform(13, 6*64, 1)

	var okResult jobs.Result
	var okID string
	t.Run("submit local files, wait, json", func(t *testing.T) {
		writeLocal(t, filepath.Join(local, "x.safetensors"), safetensors.F32("x", xShape, x))
		writeLocal(t, filepath.Join(local, "w.safetensors"), safetensors.F32("w", []int{64}, w))
		writeLocal(t, filepath.Join(local, "dy.safetensors"), safetensors.F32("dy", xShape, dy))
		out := "s3://" + bucket + "/out/local.safetensors"
		r := e.mustRun("submit", "--x", filepath.Join(local, "x.safetensors"), "--w", filepath.Join(local, "w.safetensors")+"#w",
			"--dy", filepath.Join(local, "dy.safetensors"), "--out", out, "--outputs", "dx,dw,r", "--eps", "1e-5", "--wait", "--json")
		var v struct {
			ID     string       `json:"id"`
			State  string       `json:"state"`
			Result *jobs.Result `json:"result"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatalf("submit --json output %q: %v", r.stdout, err)
		}
		if v.State != "completed" || v.Result == nil || v.ID == "" {
			t.Fatalf("submit --wait --json: %s", r.stdout)
		}
		res := v.Result
		if res.Out != out || res.Backend != "cpu" || res.Worker != "cli-test" || res.BatchID == "" || res.BatchJobs < 1 {
			t.Fatalf("result %+v", res)
		}
		if res.Timings.Total <= 0 || res.Timings.Fetch <= 0 || res.Timings.Store <= 0 || res.Timings.QueueWait <= 0 {
			t.Fatalf("result timings %+v: every stage of a completed job takes time", res.Timings)
		}
		if err := e.checkOutputs(res, x, w, dy, xShape, 1e-5, "dx", "dw", "r"); err != nil {
			t.Fatal(err)
		}
		// The three local files were uploaded under upload_prefix, named by
		// their content, and the job read them from there.
		up := uploads(t, e)
		if len(up) != 3 {
			t.Fatalf("uploads/ holds %v, want the three input files", up)
		}
		for _, name := range up {
			if !regexp.MustCompile(`^[0-9a-f]{16}-(x|w|dy)\.safetensors$`).MatchString(name) {
				t.Fatalf("uploaded object %q is not <sha256 prefix>-<file name>", name)
			}
		}
		okResult, okID = *res, v.ID
	})

	// Inputs already in S3, referred to by URI.
	in := "s3://" + bucket + "/in/b.safetensors"
	e.put(in, safetensors.F32("x", []int{4, 96}, computetest.Uniform(21, 4*96, 1)),
		safetensors.F32("w", []int{96}, computetest.Uniform(22, 96, 1)),
		safetensors.F32("dy", []int{4, 96}, computetest.Uniform(23, 4*96, 1)))
	uriArgs := func(out string) []string {
		return []string{"--x", in + "#x", "--w", in + "#w", "--dy", in + "#dy", "--out", out}
	}
	t.Run("submit URIs with caller ids, idempotent", func(t *testing.T) {
		r := e.mustRun(append([]string{"submit", "--id", "cli-b"}, uriArgs("s3://"+bucket+"/out/b.safetensors")...)...)
		if r.stdout != "cli-b\n" {
			t.Fatalf("submit printed %q, want the id", r.stdout)
		}
		// A retried submit of the same job under the same id is a no-op.
		r = e.mustRun(append([]string{"submit", "--id", "cli-b"}, uriArgs("s3://"+bucket+"/out/b.safetensors")...)...)
		if r.stdout != "cli-b\n" {
			t.Fatalf("re-submit printed %q, want the same id", r.stdout)
		}
		// Another job under a taken id is refused, naming the id.
		r = e.run(append([]string{"submit", "--id", "cli-b"}, uriArgs("s3://"+bucket+"/out/other.safetensors")...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "cli-b") || !strings.Contains(r.stderr, "already used by a different job") {
			t.Fatalf("submit of another job under id cli-b: exit %d, stderr %q", r.code, r.stderr)
		}
		for _, id := range []string{"cli-c", "cli-d"} {
			r := e.mustRun(append([]string{"submit", "--json", "--id", id}, uriArgs("s3://"+bucket+"/out/"+id+".safetensors")...)...)
			var v map[string]string
			if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v["id"] != id || v["queue"] != "rmsnorm" {
				t.Fatalf("submit --json printed %q (%v)", r.stdout, err)
			}
		}
	})

	t.Run("wait several ids: table and json", func(t *testing.T) {
		r := e.mustRun("wait", "cli-b", "cli-c", "cli-d")
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if len(lines) != 5 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "STATE") ||
			lines[4] != "3 jobs: 3 completed, 0 failed" {
			t.Fatalf("wait table:\n%s", r.stdout)
		}
		for i, id := range []string{"cli-b", "cli-c", "cli-d"} {
			if f := strings.Fields(lines[i+1]); len(f) < 4 || f[0] != id || f[1] != "completed" || f[2] != "4x96" {
				t.Fatalf("wait table row %d: %q", i+1, lines[i+1])
			}
		}
		if !strings.Contains(r.stderr, "3/3 done, 0 failed") {
			t.Fatalf("wait progress on stderr: %q", r.stderr)
		}
		r = e.mustRun("wait", "--json", "cli-b", "cli-c", "cli-d")
		var outs []outcome
		if err := json.Unmarshal([]byte(r.stdout), &outs); err != nil {
			t.Fatalf("wait --json: %q: %v", r.stdout, err)
		}
		if len(outs) != 3 || r.stderr != "" {
			t.Fatalf("wait --json: %d outcomes, stderr %q", len(outs), r.stderr)
		}
		for i, o := range outs {
			if o.State != "completed" || o.Result == nil || o.Result.Rows != 4 || o.Result.Dim != 96 {
				t.Fatalf("outcome %d: %+v", i, o)
			}
		}
		// Every completed result is equal to the oracle: the same inputs,
		// three output objects.
		x, w, dy := e.readIn(in)
		for _, o := range outs {
			if err := e.checkOutputs(o.Result, x, w, dy, []int{4, 96}, 1e-6, "dx", "dw"); err != nil {
				t.Fatalf("%s: %v", o.ID, err)
			}
		}
	})

	t.Run("status and result", func(t *testing.T) {
		r := e.mustRun("status", "cli-b")
		if !strings.HasPrefix(r.stdout, "job cli-b in queue rmsnorm: completed") {
			t.Fatalf("status: %q", r.stdout)
		}
		r = e.mustRun("status", "--json", "cli-b")
		var st jobs.Status
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.State != jobs.StateCompleted || st.Result == nil || st.Result.Out != "s3://"+bucket+"/out/b.safetensors" {
			t.Fatalf("status --json: %q (%v)", r.stdout, err)
		}
		r = e.mustRun("result", "cli-b")
		if !strings.Contains(r.stdout, "job cli-b completed: out s3://"+bucket+"/out/b.safetensors (4x96) on cpu/cli-test") ||
			!strings.Contains(r.stdout, "dx sha256 "+st.Result.SHA256["dx"]+" (F32)") || !strings.Contains(r.stdout, "dw sha256 "+st.Result.SHA256["dw"]+" (F32)") || !strings.Contains(r.stdout, "ms: queue_wait ") {
			t.Fatalf("result:\n%s", r.stdout)
		}
		if okID != "" {
			r = e.mustRun("result", "--json", okID)
			var v struct {
				ID     string      `json:"id"`
				State  string      `json:"state"`
				Result jobs.Result `json:"result"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.ID != okID || v.State != "completed" ||
				v.Result.BatchID != okResult.BatchID || v.Result.SHA256["r"] != okResult.SHA256["r"] {
				t.Fatalf("result --json %s: %q (%v), want the result submit --wait printed", okID, r.stdout, err)
			}
		}
	})

	t.Run("failing job: non-zero exit with the job's message", func(t *testing.T) {
		bad := "s3://" + bucket + "/in/bad.safetensors"
		e.put(bad, safetensors.F32("x", []int{4, 64}, computetest.Uniform(31, 256, 1)),
			safetensors.F32("w", []int{64}, computetest.Uniform(32, 64, 1)),
			safetensors.F32("dy", []int{4, 63}, computetest.Uniform(33, 252, 1)))
		r := e.run("submit", "--id", "cli-bad", "--x", bad+"#x", "--w", bad+"#w", "--dy", bad+"#dy",
			"--out", "s3://"+bucket+"/out/bad.safetensors", "--wait")
		if r.code != 1 || !strings.Contains(r.stderr, "job cli-bad") || !strings.Contains(r.stderr, "tensor dy") ||
			!strings.Contains(r.stderr, "shape [4 63]: want x's shape [4 64]") || !strings.Contains(r.stderr, "after 0 retries") {
			t.Fatalf("failing submit --wait: exit %d\nstdout %q\nstderr %q", r.code, r.stdout, r.stderr)
		}
		r = e.run("result", "cli-bad")
		if r.code != 1 || !strings.Contains(r.stderr, "tensor dy") {
			t.Fatalf("result of a failed job: exit %d, stderr %q", r.code, r.stderr)
		}
		r = e.mustRun("status", "cli-bad")
		if !strings.Contains(r.stdout, "failed (retried 0 of 3)") && !strings.Contains(r.stdout, ": failed") {
			t.Fatalf("status of a failed job: %q", r.stdout)
		}
		r = e.run("wait", "--json", "cli-b", "cli-bad")
		var outs []outcome
		if err := json.Unmarshal([]byte(r.stdout), &outs); err != nil || r.code != 1 || len(outs) != 2 ||
			outs[0].State != "completed" || outs[1].State != "failed" || !strings.Contains(outs[1].Error, "tensor dy") {
			t.Fatalf("wait of a good and a failed job: exit %d, %q (%v)", r.code, r.stdout, err)
		}
	})

	t.Run("rejected before enqueue", func(t *testing.T) {
		cases := []struct {
			name string
			args []string
			code int
			want string
		}{
			{"out is an input", []string{"--x", in + "#x", "--w", in + "#w", "--dy", in + "#dy", "--out", in}, 1, "would overwrite an input"},
			{"eps not positive", append(uriArgs("s3://"+bucket+"/out/e.safetensors"), "--eps", "-1"), 1, "eps"},
			{"unknown output", append(uriArgs("s3://"+bucket+"/out/e.safetensors"), "--outputs", "dx,grad"), 1, `unknown output "grad"`},
			{"missing --out", []string{"--x", in + "#x", "--w", in + "#w", "--dy", in + "#dy"}, 2, "--out is required"},
			{"local file outside any store", []string{"--x", "/nonexistent/x.safetensors", "--w", in + "#w", "--dy", in + "#dy", "--out", "s3://" + bucket + "/out/e.safetensors"}, 1, "no such file"},
		}
		for _, c := range cases {
			r := e.run(append([]string{"submit"}, c.args...)...)
			if r.code != c.code || !strings.Contains(r.stderr, c.want) {
				t.Errorf("%s: exit %d, stderr %q; want exit %d and %q", c.name, r.code, r.stderr, c.code, c.want)
			}
		}
		if r := e.run("status", "no-such-job"); r.code != 1 || !strings.Contains(r.stderr, "job not found") {
			t.Errorf("status of an unknown id: exit %d, stderr %q", r.code, r.stderr)
		}
	})

	t.Run("synth: ids as json, then a text summary with the oracle check", func(t *testing.T) {
		r := e.mustRun("synth", "--count", "4", "--shape", "2x8,1x3x16", "--prefix", "s3://"+bucket+"/synth", "--run", "cli", "--json")
		var v struct {
			Run string   `json:"run"`
			IDs []string `json:"ids"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Run != "cli" || len(v.IDs) != 4 || v.IDs[3] != "synth-cli-000003" {
			t.Fatalf("synth --json: %q (%v)", r.stdout, err)
		}
		r = e.mustRun(append([]string{"wait", "--json"}, v.IDs...)...)
		var outs []outcome
		if err := json.Unmarshal([]byte(r.stdout), &outs); err != nil || len(outs) != 4 {
			t.Fatalf("wait --json: %q (%v)", r.stdout, err)
		}
		for i, o := range outs {
			rows, dim := 2, 8
			if i%2 == 1 {
				rows, dim = 3, 16
			}
			if o.State != "completed" || o.Result.Rows != rows || o.Result.Dim != dim {
				t.Fatalf("synth job %d: %+v", i, o)
			}
		}
		r = e.mustRun("synth", "--count", "6", "--shape", "3x40", "--prefix", "s3://"+bucket+"/synth", "--wait")
		for _, want := range []string{"jobs          6", "completed     6 (outputs checked against the float64 oracle)",
			"failed        0", "wrong outputs 0", "jobs per batch size", "jobs/s"} {
			if !strings.Contains(r.stdout, want) {
				t.Fatalf("synth summary lacks %q:\n%s", want, r.stdout)
			}
		}
		// Mixed dtypes, each job's outputs checked in their own dtype; then
		// the same with F32 gradients.
		for _, grad := range []string{"", "f32"} {
			r = e.mustRun("synth", "--count", "8", "--shape", "3x40,2x2x33", "--dtype", "bf16,f16,bf16/f32/bf16,f32/bf16/f16",
				"--grad-dtype", grad, "--prefix", "s3://"+bucket+"/synth", "--wait")
			for _, want := range []string{"completed     8", "failed        0", "wrong outputs 0"} {
				if !strings.Contains(r.stdout, want) {
					t.Fatalf("synth --dtype (grad %q) summary lacks %q:\n%s", grad, want, r.stdout)
				}
			}
		}
		for _, bad := range [][]string{{"--dtype", "f64"}, {"--grad-dtype", "i32"}, {"--dtype", "bf16/f32"}} {
			r = e.run(append([]string{"synth", "--count", "1", "--prefix", "s3://" + bucket + "/synth"}, bad...)...)
			if r.code != 2 || !strings.Contains(r.stderr, "--") || !strings.Contains(r.stderr, "bf16") {
				t.Fatalf("synth %v: exit %d, stderr %q; want a usage error naming the supported dtypes", bad, r.code, r.stderr)
			}
		}
	})

	t.Run("redis down: a clear error, nothing uploaded", func(t *testing.T) {
		before := len(uploads(t, e))
		writeLocal(t, filepath.Join(local, "x2.safetensors"), safetensors.F32("x", xShape, computetest.Uniform(41, 6*64, 1)))
		down := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		start := time.Now()
		r := e.run("submit", "--redis", down, "--x", filepath.Join(local, "x2.safetensors"), "--w", in+"#w",
			"--dy", in+"#dy", "--out", "s3://"+bucket+"/out/down.safetensors", "--wait")
		want := "cannot reach Redis at " + down + " (from flag --redis"
		if r.code != 1 || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "connection refused") {
			t.Fatalf("submit with Redis down: exit %d, stderr %q, want %q", r.code, r.stderr, want)
		}
		if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 {
			t.Fatalf("submit with Redis down printed %d extra lines: %q", n, r.stderr)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Fatalf("submit with Redis down took %v", d)
		}
		if after := len(uploads(t, e)); after != before {
			t.Fatalf("submit with Redis down uploaded %d files", after-before)
		}
		r = e.run("wait", "--redis", down, "cli-b")
		if r.code != 1 || !strings.Contains(r.stderr, want) {
			t.Fatalf("wait with Redis down: exit %d, stderr %q", r.code, r.stderr)
		}
	})

	e.stopWorker()
}

// readIn reads x, w and dy of a synth-style input object.
func (e *cliEnv) readIn(obj string) (x, w, dy []float32) {
	e.t.Helper()
	_, x, _ = e.read(obj + "#x")
	_, w, _ = e.read(obj + "#w")
	_, dy, _ = e.read(obj + "#dy")
	return x, w, dy
}
