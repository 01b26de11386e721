package cpu

import (
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

func TestConformance(t *testing.T) {
	computetest.Run(t, func(t *testing.T) compute.Backend { return New() })
}

func TestConformanceScalar(t *testing.T) {
	computetest.Run(t, func(t *testing.T) compute.Backend { return New(Scalar()) })
}
