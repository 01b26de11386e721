//go:build !darwin || !cgo

package metal

import (
	"fmt"
	"runtime"

	"github.com/rmsgrad/rmsgrad/compute"
)

// Open returns the Metal backend. Metal needs macOS and a binary built with
// cgo (darwinkit and the device helper are Objective-C): here Open returns
// an error wrapping compute.ErrUnsupported that says which is missing.
func Open(...Option) (compute.Backend, error) {
	if runtime.GOOS == "darwin" {
		return nil, fmt.Errorf("metal: this binary was built without cgo (CGO_ENABLED=0), which the Metal backend needs: rebuild it on the Mac with `make build` (cgo on): %w", compute.ErrUnsupported)
	}
	return nil, fmt.Errorf("metal: needs macOS with a Metal GPU, this is %s/%s: %w", runtime.GOOS, runtime.GOARCH, compute.ErrUnsupported)
}
