package main

import (
	"context"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
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
		return &jobs.Result{Out: out, DTypes: map[string]string{"dx": "F32", "dw": "F32"}}
	}
	ctx := context.Background()
	f32s := inputDTypes{compute.F32, compute.F32, compute.F32}
	if err := verify(ctx, r, seed, job, sh, f32s, "", eps, put("good", eps, nil, sh.dims)); err != nil {
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
		if err := verify(ctx, r, seed, job, sh, f32s, "", eps, c.res); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: verify = %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestSynthVerifyHalf: outputs of a BF16 job are checked in their dtype:
// the oracle on the rounded inputs, rounded to BF16, passes; F32 outputs
// where BF16 is due, and a BF16 dx off by many ULPs, fail.
func TestSynthVerifyHalf(t *testing.T) {
	dir := t.TempDir()
	fs, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := storage.NewRouter()
	r.Register("file", fs)
	sh := shape{dims: []int{4, 96}, rows: 4, dim: 96}
	const seed, job, eps = 7, 2, 1e-6
	dt := inputDTypes{compute.BF16, compute.F32, compute.BF16}
	x, w, dy := synthInputs(seed, job, sh)
	x, w, dy = round(dt.x, x), round(dt.w, w), round(dt.dy, dy)
	_, dx64, dw64 := computetest.Oracle(x, w, dy, sh.rows, sh.dim, eps)
	put := func(name string, dxT, dwT compute.DType, mutate func(dx []float32)) *jobs.Result {
		dx, dw := round(dxT, f32(dx64)), round(dwT, f32(dw64))
		if mutate != nil {
			mutate(dx)
		}
		out := "file://" + dir + "/" + name + ".safetensors"
		if _, err := r.Write(context.Background(), out, []storage.OutTensor{
			{Name: "dx", DType: string(dxT), Shape: sh.dims, Data: encode(dxT, dx)},
			{Name: "dw", DType: string(dwT), Shape: []int{sh.dim}, Data: encode(dwT, dw)}}, nil); err != nil {
			t.Fatal(err)
		}
		return &jobs.Result{Out: out, DTypes: map[string]string{"dx": string(dxT), "dw": string(dwT)}}
	}
	ctx := context.Background()
	if err := verify(ctx, r, seed, job, sh, dt, "", eps, put("good", compute.BF16, compute.F32, nil)); err != nil {
		t.Fatalf("BF16 oracle outputs rejected: %v", err)
	}
	if err := verify(ctx, r, seed, job, sh, dt, compute.F32, eps, put("good32", compute.F32, compute.F32, nil)); err != nil {
		t.Fatalf("F32 gradients of a BF16 job rejected: %v", err)
	}
	if err := verify(ctx, r, seed, job, sh, dt, "", eps, put("f32", compute.F32, compute.F32, nil)); err == nil || !strings.Contains(err.Error(), "want BF16") {
		t.Fatalf("F32 dx where BF16 is due: %v", err)
	}
	if err := verify(ctx, r, seed, job, sh, dt, "", eps, put("off", compute.BF16, compute.F32, func(dx []float32) { dx[9] *= 1.05 })); err == nil || !strings.Contains(err.Error(), "dx (BF16)[9]") {
		t.Fatalf("BF16 dx 5%% off: %v", err)
	}
}

func TestParseDTypes(t *testing.T) {
	got, err := parseDTypes("bf16, F16,bf16/f32/BF16")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != (inputDTypes{compute.BF16, compute.BF16, compute.BF16}) || got[1].w != compute.F16 ||
		got[2] != (inputDTypes{compute.BF16, compute.F32, compute.BF16}) {
		t.Fatalf("parseDTypes = %v", got)
	}
	for _, bad := range []string{"f64", "bf16/f32", "i32", "", "f8_e4m3", "bf16,"} {
		if _, err := parseDTypes(bad); err == nil || !strings.Contains(err.Error(), "--dtype") {
			t.Errorf("parseDTypes(%q) = %v, want an error", bad, err)
		}
	}
	if _, err := parseDType("grad-dtype", "F64"); err == nil || !strings.Contains(err.Error(), "supported: f32, bf16, f16") {
		t.Errorf("parseDType(F64) = %v", err)
	}
}

func f32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, f := range v {
		out[i] = float32(f)
	}
	return out
}
