//go:build !darwin || !cgo

package metal

import (
	"errors"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

func TestOpenUnsupported(t *testing.T) {
	b, err := Open()
	if b != nil || !errors.Is(err, compute.ErrUnsupported) {
		t.Fatalf("Open() = %v, %v; want nil and an error wrapping compute.ErrUnsupported", b, err)
	}
}
