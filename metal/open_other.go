//go:build !darwin

package metal

import (
	"fmt"
	"runtime"

	"github.com/rmsgrad/rmsgrad/compute"
)

// Open returns the Metal backend. Metal needs macOS: on this platform it
// returns an error wrapping compute.ErrUnsupported.
func Open() (compute.Backend, error) {
	return nil, fmt.Errorf("metal: needs macOS with a Metal GPU, this is %s/%s: %w", runtime.GOOS, runtime.GOARCH, compute.ErrUnsupported)
}
