package main

import (
	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/metal"
)

// The metal backend is in every build. On a Mac built with cgo (make build
// turns cgo on for darwin) it is darwinkit's Metal; on a Mac built without
// cgo, and on every other OS, Open returns compute.ErrUnsupported saying
// why, so backend: auto moves on and backend: metal fails at start with
// that reason.
func init() {
	backends["metal"] = func(poolBytes int64) (compute.Backend, error) {
		return metal.Open(metal.PoolLimit(poolBytes))
	}
}
