package main

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
)

// opener opens one compute backend; compute.ErrUnsupported means "not on
// this machine".
type opener func() (compute.Backend, error)

// backends maps each name of the backend key to its opener. metal and cuda
// are added by backend_metal.go / backend_cuda.go when those packages are
// in the tree, so this file compiles on its own.
var backends = map[string]opener{"cpu": cpu.Open}

// autoOrder is what backend: auto tries, first that opens wins: Metal on a
// Mac with a GPU, then CUDA if a GPU answers, else the CPU.
var autoOrder = []string{"metal", "cuda", "cpu"}

// openBackend opens the backend name (auto|cpu|metal|cuda) and logs which
// device it got.
func openBackend(name string, log *slog.Logger) (compute.Backend, error) {
	try := []string{name}
	if name == "auto" {
		try = autoOrder
	}
	var errs []error
	for _, n := range try {
		open, ok := backends[n]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: not built into this worker (%s/%s): %w", n, runtime.GOOS, runtime.GOARCH, compute.ErrUnsupported))
			continue
		}
		be, err := open()
		if err == nil {
			log.Info("compute backend open", "backend", be.Name(), "device", be.DeviceName(), "asked", name)
			return be, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", n, err))
		if name != "auto" || !errors.Is(err, compute.ErrUnsupported) {
			break
		}
		log.Info("backend unavailable, trying the next", "backend", n, "err", err)
	}
	return nil, fmt.Errorf("config: backend %q: %w", name, errors.Join(errs...))
}
