package main

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
)

// opener opens one compute backend whose buffer pool keeps at most
// poolBytes in use and pooled together (0: the backend's default);
// compute.ErrUnsupported means "not on this machine".
type opener func(poolBytes int64) (compute.Backend, error)

// backends maps each name of the backend key to its opener. metal and cuda
// are added by backend_metal.go / backend_cuda.go, so this file compiles on
// its own.
var backends = map[string]opener{"cpu": func(n int64) (compute.Backend, error) { return cpu.New(cpu.PoolLimit(n)), nil }}

// autoOrder is what backend: auto tries, first that opens wins: Metal on a
// Mac with a GPU, then CUDA if a GPU answers, else the CPU.
var autoOrder = []string{"metal", "cuda", "cpu"}

// openBackend opens the backend name (auto|cpu|metal|cuda) with its buffer
// pool bounded by poolBytes and logs which device it got. A backend asked
// for by name that cannot open is an error naming why (not built in, no
// cgo, no GPU, an unsupported GPU); auto moves on to the next.
func openBackend(name string, poolBytes int64, log *slog.Logger) (compute.Backend, error) {
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
		be, err := openLogged(n, open, poolBytes, log)
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

// openProgressAfter and openProgressEvery pace the progress lines of a
// backend that is slow to open: the cuda backend compiles its kernels with
// NVRTC at the first start on a host (50-80 s on an H100 host, 19-38 s on
// an H200's; later starts load them from the cache).
var openProgressAfter, openProgressEvery = 10 * time.Second, 15 * time.Second

// openLogged opens backend n and, while that takes longer than
// openProgressAfter, logs every openProgressEvery that it is still opening.
// No progress line follows its return.
func openLogged(n string, open opener, poolBytes int64, log *slog.Logger) (compute.Backend, error) {
	done, stopped := make(chan struct{}), make(chan struct{})
	t0 := time.Now()
	wait, every := openProgressAfter, openProgressEvery
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case <-time.After(wait):
			}
			select {
			case <-done:
				return
			default:
			}
			log.Info("still opening the compute backend (a GPU backend compiles its kernels at the first start on a host)",
				"backend", n, "elapsed", time.Since(t0).Round(time.Second))
			wait = every
		}
	}()
	be, err := open(poolBytes)
	close(done)
	<-stopped
	return be, err
}

// reserver is a backend that can pin host memory for its buffer pool up
// front (the cuda backend's Reserve).
type reserver interface {
	Reserve(n int64) (time.Duration, error)
}

// reservePinned reserves n bytes of pinned host memory for be's buffer
// pool when be can (pin_reserve_bytes): a fresh worker's first jobs then
// take buffers from it instead of pinning their own one by one. A reserve
// that fails is logged and the worker goes on pinning as buffers are
// needed, as with no reserve.
func reservePinned(be compute.Backend, n int64, log *slog.Logger) {
	r, ok := be.(reserver)
	if !ok || n <= 0 {
		return
	}
	took, err := r.Reserve(n)
	if err != nil {
		log.Warn("pin_reserve_bytes: reserving pinned host memory failed; buffers are pinned as they are needed", "bytes", n, "err", err)
		return
	}
	log.Info("pinned host memory reserved for the buffer pool", "bytes", n, "took", took.Round(time.Millisecond).String())
}
