package main

import (
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/cuda"
)

// backend: auto takes cuda where a GPU answers and the CPU otherwise (on
// Linux metal is not built in and is skipped the same way).
func TestAutoPicksCUDAOrFallsBack(t *testing.T) {
	want := "cuda"
	if c, err := cuda.Open(); err != nil {
		if !errors.Is(err, compute.ErrUnsupported) {
			t.Fatalf("cuda.Open: %v", err)
		}
		want = "cpu"
	} else {
		c.Close()
	}
	be, err := openBackend("auto", 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if be.Name() != want {
		t.Fatalf("auto opened %q, want %q", be.Name(), want)
	}
	if want == "cpu" {
		if _, err := openBackend("cuda", 0, slog.New(slog.NewTextHandler(io.Discard, nil))); !errors.Is(err, compute.ErrUnsupported) {
			t.Fatalf("backend cuda without a GPU: %v, want ErrUnsupported", err)
		}
	}
}
