package main

import (
	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/cuda"
)

// The cuda backend (purego, no cgo) is in every build: on a machine without
// libcuda.so.1 or a GPU it opens with compute.ErrUnsupported and auto moves
// on to the CPU.
func init() { backends["cuda"] = func(int64) (compute.Backend, error) { return cuda.Open() } }
