package main

import (
	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/cuda"
)

// The cuda backend (purego, no cgo) is in every build: on a machine without
// libcuda.so.1 or a GPU it opens with compute.ErrUnsupported and auto moves
// on to the CPU. Its pool (pinned host and device memory) is bounded like
// the others' (poolBytes).
func init() {
	backends["cuda"] = func(n int64) (compute.Backend, error) { return cuda.Open(cuda.PoolLimit(n)) }
}
