package compute_test

import (
	"context"
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// fake is a Backend that only records what reaches Execute, so these tests
// check the CommandBuffer's own rules without any real kernel.
type fake struct {
	executed [][]compute.Op
}

type fakeBuf struct {
	dt    compute.DType
	shape []int
	w     []float32
}

func (b *fakeBuf) DType() compute.DType { return b.dt }
func (b *fakeBuf) Shape() []int         { return b.shape }
func (b *fakeBuf) Len() int             { return compute.NumElements(b.shape) }
func (b *fakeBuf) Bytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b.w))), b.Len()*b.dt.Size())
}
func (b *fakeBuf) Float32s() []float32 {
	if b.dt != compute.F32 {
		return nil
	}
	return b.w[:b.Len()]
}
func (b *fakeBuf) Release() {}

func (f *fake) Name() string       { return "fake" }
func (f *fake) DeviceName() string { return "fake" }
func (f *fake) Close() error       { return nil }
func (f *fake) Alloc(dt compute.DType, shape ...int) (compute.Buffer, error) {
	n := compute.NumElements(shape)
	return &fakeBuf{dt: dt, shape: shape, w: make([]float32, (n*dt.Size()+3)/4+1)}, nil
}
func (f *fake) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	f.executed = append(f.executed, append([]compute.Op(nil), ops...))
	return time.Millisecond, nil
}

// TestValidation runs the conformance suite's validation cases against the
// fake: they test CommandBuffer itself, whatever the backend.
func TestValidation(t *testing.T) {
	computetest.RunValidation(t, func(t *testing.T) compute.Backend { return &fake{} })
}

func TestNumElements(t *testing.T) {
	for _, c := range []struct {
		shape []int
		want  int
	}{
		{nil, 1}, {[]int{0}, 0}, {[]int{3, 4}, 12}, {[]int{-1, 2}, -1},
		{[]int{1 << 62, 4}, -1}, {[]int{1 << 31, 1 << 31, 1 << 2}, -1}, {[]int{0, 1 << 62, 1 << 62}, 0},
	} {
		if got := compute.NumElements(c.shape); got != c.want {
			t.Errorf("NumElements(%v) = %d, want %d", c.shape, got, c.want)
		}
	}
}

func bufs(t *testing.T, b compute.Backend, rows, dim int) (x, w, dy, r, dx, dw compute.Buffer) {
	t.Helper()
	a := func(shape ...int) compute.Buffer {
		buf, err := b.Alloc(compute.F32, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	return a(rows, dim), a(dim), a(rows, dim), a(rows), a(rows, dim), a(dim)
}

func TestRecordingAndCommit(t *testing.T) {
	f := &fake{}
	x, w, dy, r, dx, dw := bufs(t, f, 2, 3)
	cb := compute.NewCommandBuffer(f)
	cb.Barrier() // a leading barrier is dropped
	if err := cb.RMSInv(x, r, compute.RMSInvParams(1e-5, 3), 2, 3); err != nil {
		t.Fatal(err)
	}
	cb.Barrier()
	cb.Barrier() // a repeated barrier is dropped
	if err := cb.DX(x, w, dy, r, dx, compute.DXParams(3, 1e-5), 2, 3); err != nil {
		t.Fatal(err)
	}
	// A rejected dispatch records nothing.
	if err := cb.DW(x, dy, r, dw, compute.DWParams(3, 5), 2, 3); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Fatalf("DW with wrong rows param: %v", err)
	}
	if err := cb.DW(x, dy, r, dw, compute.DWParams(3, 2), 2, 3); err != nil {
		t.Fatal(err)
	}
	kinds := []compute.OpKind{compute.OpRMSInv, compute.OpBarrier, compute.OpDX, compute.OpDW}
	if len(cb.Ops()) != len(kinds) {
		t.Fatalf("%d ops recorded, want %d", len(cb.Ops()), len(kinds))
	}
	for i, k := range kinds {
		if cb.Ops()[i].Kind != k {
			t.Fatalf("op %d kind %d, want %d", i, cb.Ops()[i].Kind, k)
		}
	}
	if op := cb.Ops()[0]; op.Kernel() != compute.KernelRMSInv || op.Eps() != 1e-5 || op.Rows != 2 || op.Dim != 3 {
		t.Fatalf("RMSInv op %+v", op)
	}
	tm, err := cb.Commit(context.Background())
	if err != nil || tm.Device != time.Millisecond || len(f.executed) != 1 {
		t.Fatalf("Commit = %v, %v; %d executions", tm, err, len(f.executed))
	}
	cb.Reset()
	if len(cb.Ops()) != 0 {
		t.Fatal("Reset kept ops")
	}
	// After Reset, the r written before is not "written since the barrier".
	if err := cb.DX(x, w, dy, r, dx, compute.DXParams(3, 1e-5), 2, 3); err != nil {
		t.Fatalf("DX after Reset: %v", err)
	}
}

func TestCommitEmptyAndCancelled(t *testing.T) {
	f := &fake{}
	cb := compute.NewCommandBuffer(f)
	if _, err := cb.Commit(context.Background()); err != nil || len(f.executed) != 0 {
		t.Fatalf("empty Commit: %v, %d executions", err, len(f.executed))
	}
	x, _, _, r, _, _ := bufs(t, f, 2, 3)
	cb = compute.NewCommandBuffer(f)
	if err := cb.RMSInv(x, r, compute.RMSInvParams(1e-5, 3), 2, 3); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := cb.Commit(ctx); !errors.Is(err, context.Canceled) || len(f.executed) != 0 {
		t.Fatalf("cancelled Commit: %v, %d executions", err, len(f.executed))
	}
}

func TestArgErrorMessage(t *testing.T) {
	f := &fake{}
	cb := compute.NewCommandBuffer(f)
	x, _, _, r, _, _ := bufs(t, f, 2, 3)
	err := cb.RMSInv(x, r, compute.RMSInvParams(1e-5, 3), 0, 3)
	var ae *compute.ArgError
	if !errors.As(err, &ae) || err.Error() != "rms_norm_compute_rms_inv_f32: rows: want > 0, got 0" {
		t.Fatalf("%v", err)
	}
	if errors.Is(err, compute.ErrDevice) {
		t.Fatal("ArgError matches ErrDevice")
	}
}
