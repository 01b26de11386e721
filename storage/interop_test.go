package storage_test

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

func python(t *testing.T) string {
	t.Helper()
	py := os.Getenv("RMSGRAD_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if err := exec.Command(py, "-c", "import numpy").Run(); err != nil {
		msg := py + " with numpy is not available (apt-get install python3-numpy, or run scripts/test.sh)"
		if os.Getenv("RMSGRAD_REQUIRE_SERVERS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

// TestPythonInterop: a file written by numpy loads with the right values
// through the router, and ours loads (values and sha256s) in numpy.
func TestPythonInterop(t *testing.T) {
	py := python(t)
	ctx := context.Background()
	r, dir := fileRouter(t)
	in := filepath.Join(dir, "from-numpy.safetensors")
	if out, err := exec.Command(py, "safetensors/testdata/interop.py", "write", in).CombinedOutput(); err != nil {
		t.Fatalf("interop.py write: %v\n%s", err, out)
	}
	x := fetchF32(t, r, "file://"+in+"#x", []int{3, 4})
	for i, v := range x {
		if want := (float32(i) - 5.5) / 3; v != want {
			t.Fatalf("x[%d] = %v, want %v", i, v, want)
		}
	}
	w := fetchF32(t, r, "file://"+in+"#w", []int{4})
	if w[0] != 1 || w[1] != -2 || w[2] != 0.5 || w[3] != 1e-30 {
		t.Fatalf("w = %v", w)
	}

	outPath := filepath.Join(dir, "to-numpy.safetensors")
	dx := make([]float32, 6)
	for i := range dx {
		dx[i] = float32(i)*0.25 - 1
	}
	if _, err := r.Write(ctx, "file://"+outPath, []storage.OutTensor{
		safetensors.F32("dx", []int{2, 3}, dx),
		safetensors.F32("dw", []int{2}, []float32{3.5, -0.125}),
	}, map[string]string{"job": "interop"}); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(py, "safetensors/testdata/interop.py", "check", outPath).CombinedOutput(); err != nil {
		t.Fatalf("interop.py check: %v\n%s", err, out)
	}
}

func fetchF32(t *testing.T, r *storage.Router, uri string, shape []int) []float32 {
	t.Helper()
	info, err := r.Head(context.Background(), uri)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Shape) != len(shape) {
		t.Fatalf("%s: shape %v, want %v", uri, info.Shape, shape)
	}
	for i := range shape {
		if info.Shape[i] != shape[i] {
			t.Fatalf("%s: shape %v, want %v", uri, info.Shape, shape)
		}
	}
	buf := make([]byte, info.Size)
	if err := r.Fetch(context.Background(), info, buf); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(buf)/4)
	for i := range out {
		out[i] = math.Float32frombits(uint32(buf[4*i]) | uint32(buf[4*i+1])<<8 | uint32(buf[4*i+2])<<16 | uint32(buf[4*i+3])<<24)
	}
	return out
}
