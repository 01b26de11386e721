package metal

import (
	"errors"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// openTest returns the Metal backend, skipping when the machine has no Metal
// device (a CI VM without a GPU); any other failure (the source does not
// compile, a pipeline fails) is a test failure.
func openTest(t *testing.T) compute.Backend {
	t.Helper()
	b, err := Open()
	if err != nil {
		if errors.Is(err, compute.ErrUnsupported) && b == nil && isNoDevice(err) {
			t.Skipf("no Metal device: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func isNoDevice(err error) bool { return strings.HasPrefix(err.Error(), "metal: no Metal device") }

// The whole conformance suite on the GPU, every shape included.
func TestConformance(t *testing.T) {
	computetest.Run(t, openTest)
}

func TestValidation(t *testing.T) {
	computetest.RunValidation(t, openTest)
}

// Buffers are views of the shared MTLBuffer: a write through Float32s is
// seen through Bytes, and a released buffer's memory is reused.
func TestSharedBufferViewsAndPool(t *testing.T) {
	b := openTest(t)
	buf, err := b.Alloc(compute.F32, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	f := buf.Float32s()
	if len(f) != 15 || len(buf.Bytes()) != 60 {
		t.Fatalf("views: %d floats, %d bytes; want 15, 60", len(f), len(buf.Bytes()))
	}
	f[0] = 1
	if buf.Bytes()[3] != 0x3f {
		t.Fatalf("Bytes does not alias Float32s: % x", buf.Bytes()[:4])
	}
	p := &buf.Bytes()[0]
	buf.Release()
	again, err := b.Alloc(compute.F32, 15)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release()
	if &again.Bytes()[0] != p {
		t.Error("a released buffer of the same length was not reused")
	}
}
