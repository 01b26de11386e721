package mslcpu

import (
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// The whole conformance suite against the shader running on the CPU.
func TestConformance(t *testing.T) {
	computetest.Run(t, func(t *testing.T) compute.Backend { return testBackend(t, 0) })
}

// Every invalid dispatch is rejected before the driver runs.
func TestValidation(t *testing.T) {
	computetest.RunValidation(t, func(t *testing.T) compute.Backend { return testBackend(t, 0) })
}
