package computetest

import (
	"fmt"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

// noHalf is a backend whose Alloc of a half dtype is unsupported, as a
// backend without half dtypes is to say it.
type noHalf struct{ compute.Backend }

func (n noHalf) Name() string { return "no-half" }
func (n noHalf) Alloc(dt compute.DType, shape ...int) (compute.Buffer, error) {
	if dt != compute.F32 {
		return nil, fmt.Errorf("no-half: %s: %w", dt, compute.ErrUnsupported)
	}
	return n.Backend.Alloc(dt, shape...)
}

// fakeHalf allocates any dtype (plain host memory), for needHalf's check.
type fakeHalf struct{ compute.Backend }

type hostBuf struct {
	dt compute.DType
	b  []byte
}

func (h *hostBuf) DType() compute.DType { return h.dt }
func (h *hostBuf) Shape() []int         { return []int{len(h.b) / h.dt.Size()} }
func (h *hostBuf) Len() int             { return len(h.b) / h.dt.Size() }
func (h *hostBuf) Bytes() []byte        { return h.b }
func (h *hostBuf) Float32s() []float32  { return nil }
func (h *hostBuf) Release()             {}

func (fakeHalf) Name() string { return "fake-half" }
func (fakeHalf) Alloc(dt compute.DType, shape ...int) (compute.Buffer, error) {
	return &hostBuf{dt, make([]byte, dt.Size()*compute.NumElements(shape))}, nil
}

// TestNeedHalf: the dtype cases skip for a backend whose half Alloc is
// unsupported, and run for one that allocates half buffers.
func TestNeedHalf(t *testing.T) {
	ran := false
	t.Run("unsupported", func(t *testing.T) {
		needHalf(t, noHalf{})
		ran = true
	})
	if ran {
		t.Fatal("needHalf did not skip a backend whose Alloc(BF16) is unsupported")
	}
	t.Run("supported", func(t *testing.T) {
		needHalf(t, fakeHalf{})
		ran = true
	})
	if !ran {
		t.Fatal("needHalf skipped a backend that allocates BF16")
	}
}
