package jobs

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	dto "github.com/prometheus/client_model/go"

	"github.com/rmsgrad/rmsgrad/compute"
)

// putInputsAs stores putInputs' values with x, w and dy in the given
// dtypes (rounded to them).
func putInputsAs(s *memStore, prefix string, seed uint64, shape []int, x, w, dy compute.DType) {
	putInputs(s, prefix, seed, shape)
	for _, in := range []struct {
		name string
		dt   compute.DType
	}{{"x", x}, {"w", w}, {"dy", dy}} {
		t := s.tensors[prefix+"/"+in.name]
		v := make([]float32, len(t.data)/4)
		compute.F32.Decode(v, t.data)
		s.putAs(prefix+"/"+in.name, in.dt, t.shape, v)
	}
}

// outputAs decodes a stored output of dtype dt.
func (s *memStore) outputAs(uri, name string) (compute.DType, []float32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.outs[uri] {
		if o.Name == name {
			dt := compute.DType(o.DType)
			v := make([]float32, len(o.Data)/dt.Size())
			dt.Decode(v, o.Data)
			return dt, v
		}
	}
	return "", nil
}

// TestHandlerDTypes: each input is read in its own dtype, dx and dw come
// out like x and w or in the job's grad_dtype, r in F32; the result and
// the stored tensors say so; each half output is the F32 output of the
// same job rounded once; the tensors are counted by dtype.
func TestHandlerDTypes(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name           string
		x, w, dy       compute.DType
		grad           string
		wantDX, wantDW compute.DType
	}{
		{"bf16 activations, f32 weight", compute.BF16, compute.F32, compute.BF16, "", compute.BF16, compute.F32},
		{"all bf16", compute.BF16, compute.BF16, compute.BF16, "", compute.BF16, compute.BF16},
		{"f16 with f32 gradients", compute.F16, compute.BF16, compute.F16, "F32", compute.F32, compute.F32},
		{"f32 in, f16 out", compute.F32, compute.F32, compute.F32, "F16", compute.F16, compute.F16},
		{"mixed, bf16 out", compute.F16, compute.F32, compute.BF16, "BF16", compute.BF16, compute.BF16},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newHandlerEnv(t, Limits{}, 1<<30, nil)
			putInputsAs(e.store, "mem://ok/a", 3, []int{2, 3, 40}, c.x, c.w, c.dy)
			j := testJob("mem://ok/a")
			j.Outputs = []string{OutDX, OutDW, OutR}
			j.GradDType = c.grad
			res, err := e.h.process(ctx, "id", payload(t, j), nil)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"dx": string(c.wantDX), "dw": string(c.wantDW), "r": "F32"}
			for k, v := range want {
				if res.DTypes[k] != v {
					t.Fatalf("result dtypes %v, want %v", res.DTypes, want)
				}
				if dt, _ := e.store.outputAs(j.Out, k); string(dt) != v {
					t.Fatalf("stored %s is %s, want %s", k, dt, v)
				}
			}
			// The same job with F32 gradients: each half output is that
			// rounded once.
			f := j
			f.Out, f.GradDType = "mem://ok/a/out32", "F32"
			if _, err := e.h.process(ctx, "id32", payload(t, f), nil); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"dx", "dw", "r"} {
				dt, got := e.store.outputAs(j.Out, name)
				_, ref := e.store.outputAs(f.Out, name)
				if len(got) != len(ref) || len(got) == 0 {
					t.Fatalf("%s: %d values, F32 run %d", name, len(got), len(ref))
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(dt.Round(ref[i])) {
						t.Fatalf("%s (%s)[%d] = %v, F32 run %v rounded = %v", name, dt, i, got[i], ref[i], dt.Round(ref[i]))
					}
				}
			}
			for _, tc := range []struct {
				tensor string
				dt     compute.DType
			}{{"x", c.x}, {"w", c.w}, {"dy", c.dy}, {"dx", c.wantDX}, {"dw", c.wantDW}} {
				var m dto.Metric
				if err := e.h.m.Tensors.WithLabelValues(tc.tensor, string(tc.dt)).Write(&m); err != nil {
					t.Fatal(err)
				}
				if n := m.GetCounter().GetValue(); n < 1 {
					t.Fatalf("rmsgrad_tensors_total{tensor=%q,dtype=%q} = %v", tc.tensor, tc.dt, n)
				}
			}
		})
	}
}

// TestHandlerHalfNonFinite: a NaN or Inf in a BF16 or F16 input is a
// permanent error naming the tensor, the count and the first index; an F16
// output that overflows (|dx| > 65504) fails the job.
func TestHandlerHalfNonFinite(t *testing.T) {
	ctx := context.Background()
	for _, dt := range []compute.DType{compute.BF16, compute.F16} {
		e := newHandlerEnv(t, Limits{}, 1<<30, nil)
		putInputsAs(e.store, "mem://ok/n", 4, []int{4, 70}, dt, dt, dt)
		v := make([]float32, 280)
		for i := range v {
			v[i] = 0.5
		}
		v[66], v[200] = float32(math.Inf(-1)), float32(math.NaN())
		e.store.putAs("mem://ok/n/dy", dt, []int{4, 70}, v)
		err := e.h.ProcessTask(ctx, asynq.NewTask(TaskType, payload(t, testJob("mem://ok/n"))))
		if !errors.Is(err, ErrNonFinite) || !errors.Is(err, asynq.SkipRetry) {
			t.Fatalf("%s: %v, want a permanent ErrNonFinite", dt, err)
		}
		for _, w := range []string{"tensor dy", "2 NaN/Inf of 280 " + string(dt), "first at flat index 66"} {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: %q lacks %q", dt, err, w)
			}
		}
	}
	// dx = r*(dy*w - ...) with w = 3e4 and dy = 10 overflows F16.
	e := newHandlerEnv(t, Limits{}, 1<<30, nil)
	x, dy, w := make([]float32, 64), make([]float32, 64), make([]float32, 32)
	for i := range x {
		x[i], dy[i] = 1, 10*float32(i%2*2-1)
	}
	for i := range w {
		w[i] = 3e4
	}
	e.store.putAs("mem://ok/o/x", compute.F16, []int{2, 32}, x)
	e.store.putAs("mem://ok/o/w", compute.F16, []int{32}, w)
	e.store.putAs("mem://ok/o/dy", compute.F16, []int{2, 32}, dy)
	err := e.h.ProcessTask(ctx, asynq.NewTask(TaskType, payload(t, testJob("mem://ok/o"))))
	if !errors.Is(err, ErrNonFinite) || !errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), "tensor dx") || !strings.Contains(err.Error(), "F16 values") {
		t.Fatalf("F16 overflow: %v, want a permanent ErrNonFinite on dx", err)
	}
}
