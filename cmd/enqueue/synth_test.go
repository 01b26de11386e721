package main

import (
	"context"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

func TestParseShapes(t *testing.T) {
	got, err := parseShapes("8x1024, 2x3x64,1x1")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ rows, dim int }{{8, 1024}, {6, 64}, {1, 1}}
	for i, w := range want {
		if got[i].rows != w.rows || got[i].dim != w.dim {
			t.Fatalf("shape %d: %+v, want rows %d dim %d", i, got[i], w.rows, w.dim)
		}
	}
	if got[1].String() != "2x3x64" {
		t.Fatalf("String() = %q", got[1].String())
	}
	for _, bad := range []string{"8", "8x", "0x4", "4x-1", "ax4", "4x4,", ""} {
		if _, err := parseShapes(bad); err == nil {
			t.Errorf("parseShapes(%q) accepted", bad)
		}
	}
}

// TestSynthVerifyCatchesWrongOutputs: the oracle check synth runs on every
// waited-for job accepts outputs equal to the oracle and rejects a wrong
// eps, a perturbed element and a wrong shape.
func TestSynthVerifyCatchesWrongOutputs(t *testing.T) {
	dir := t.TempDir()
	fs, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := storage.NewRouter()
	r.Register("file", fs)
	sh := shape{dims: []int{2, 3, 64}, rows: 6, dim: 64}
	const seed, job, eps = 5, 3, 1e-6
	x, w, dy := synthInputs(seed, job, sh)
	put := func(name string, epsUsed float64, mutate func(dx, dw []float32), dxShape []int) *jobs.Result {
		_, dx64, dw64 := computetest.Oracle(x, w, dy, sh.rows, sh.dim, epsUsed)
		dx, dw := f32(dx64), f32(dw64)
		if mutate != nil {
			mutate(dx, dw)
		}
		out := "file://" + dir + "/" + name + ".safetensors"
		if _, err := r.Write(context.Background(), out, []storage.OutTensor{
			safetensors.F32("dx", dxShape, dx), safetensors.F32("dw", []int{sh.dim}, dw)}, nil); err != nil {
			t.Fatal(err)
		}
		return &jobs.Result{Out: out}
	}
	ctx := context.Background()
	if err := verify(ctx, r, seed, job, sh, eps, put("good", eps, nil, sh.dims)); err != nil {
		t.Fatalf("oracle outputs rejected: %v", err)
	}
	for _, c := range []struct {
		name string
		res  *jobs.Result
		want string
	}{
		{"eps", put("eps", 1e-2, nil, sh.dims), "dx["},
		{"dw element", put("dw", eps, func(_, dw []float32) { dw[17] *= 1.001 }, sh.dims), "dw[17]"},
		{"dx shape", put("shape", eps, nil, []int{6, 64}), "shape [6 64]"},
	} {
		if err := verify(ctx, r, seed, job, sh, eps, c.res); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: verify = %v, want an error with %q", c.name, err, c.want)
		}
	}
}

func f32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, f := range v {
		out[i] = float32(f)
	}
	return out
}
