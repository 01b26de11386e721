package cuda

import (
	"errors"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

// On a machine without a GPU, Open must fail fast with ErrUnsupported and a
// reason, never panic; on a GPU machine it must name the device and arch.
func TestOpen(t *testing.T) {
	b, err := Open()
	if err != nil {
		if !errors.Is(err, compute.ErrUnsupported) {
			t.Fatalf("Open without a usable GPU: %v, want an error wrapping compute.ErrUnsupported", err)
		}
		t.Skipf("no CUDA device here (expected in CI): %v", err)
	}
	defer b.Close()
	if b.Name() != "cuda" {
		t.Errorf("Name() = %q, want cuda", b.Name())
	}
	t.Logf("device %s", b.DeviceName())
}
