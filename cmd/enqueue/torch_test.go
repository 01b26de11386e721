package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// torchPython returns a python3 that imports torch and numpy (Debian's
// python3-torch, which scripts/test.sh installs), or skips; with
// RMSGRAD_REQUIRE_SERVERS=1 (scripts/test.sh) a missing one fails instead.
func torchPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("RMSGRAD_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import torch, numpy").CombinedOutput(); err != nil {
		msg := py + " with torch and numpy is not available (apt-get install python3-torch python3-numpy, or run scripts/test.sh): " + strings.TrimSpace(string(out))
		if os.Getenv("RMSGRAD_REQUIRE_SERVERS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

// TestTorchInterop: torch writes BF16, F16 and mixed safetensors inputs;
// the built enqueue submits them to the built worker (uploading the local
// files); numpy reads the outputs (BF16 as shifted uint16) and they agree
// with torch's float64 autograd of RMSNorm on the same (upcast) values
// within one rounding of each output's dtype (testdata/torch_interop.py
// argues the bound), in the dtypes the job asked for.
func TestTorchInterop(t *testing.T) {
	py := torchPython(t)
	e := newCLIEnv(t)
	dir := t.TempDir()
	script := filepath.Join("testdata", "torch_interop.py")
	if out, err := exec.Command(py, script, "write", dir).CombinedOutput(); err != nil {
		t.Fatalf("torch_interop.py write: %v\n%s", err, out)
	}
	for _, c := range []struct {
		in, grad       string
		wantDX, wantDW string
	}{
		{"bf16", "", "BF16", "BF16"},
		{"bf16", "f32", "F32", "F32"},
		{"f16", "", "F16", "F16"},
		{"mixed", "", "BF16", "F32"},
		{"mixed", "bf16", "BF16", "BF16"},
	} {
		name := c.in + "-" + c.grad
		t.Run(name, func(t *testing.T) {
			in := filepath.Join(dir, c.in+".safetensors")
			key := "torch/" + name + ".safetensors"
			r := e.mustRun("submit", "--x", in+"#x", "--w", in+"#w", "--dy", in+"#dy", "--out", "s3://"+bucket+"/"+key,
				"--outputs", "dx,dw,r", "--eps", "1e-5", "--grad-dtype", c.grad, "--wait", "--json")
			var v struct {
				State  string       `json:"state"`
				Result *jobs.Result `json:"result"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.State != "completed" || v.Result == nil {
				t.Fatalf("submit: %q (%v)", r.stdout, err)
			}
			if d := v.Result.DTypes; d["dx"] != c.wantDX || d["dw"] != c.wantDW || d["r"] != "F32" {
				t.Fatalf("result dtypes %v, want dx %s, dw %s, r F32", d, c.wantDX, c.wantDW)
			}
			// versitygw keeps each object as a file under its root.
			out := filepath.Join(e.s3.Root, bucket, filepath.FromSlash(key))
			res, err := exec.Command(py, script, "check", in, out, c.wantDX, c.wantDW).CombinedOutput()
			t.Logf("%s", res)
			if err != nil {
				t.Fatalf("torch_interop.py check: %v", err)
			}
		})
	}
}
