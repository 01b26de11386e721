package cuda

import (
	"context"
	"fmt"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
)

// Execute is NOT implemented yet: the job-table planner (uploads, fused
// launches of shaders.CUDARowsKernel per phase, dw reduction, downloads, one
// synchronize) was not finished by the deadline. It fails every call with an
// error wrapping compute.ErrUnsupported so callers fall back to cpu.
func (b *Backend) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	return 0, fmt.Errorf("cuda: Execute not implemented yet: %w", compute.ErrUnsupported)
}
