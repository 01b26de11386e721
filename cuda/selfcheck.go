package cuda

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// selfCheckJobs are the jobs Open runs before it returns the backend: one
// small job per fused kernel (F32 rows in c0-c6, BF16 and F16 rows in
// each of c7-c12), jobs of several row groups with the dw reduction, and
// the general kernel (a dim that is no multiple of 4, a half dim that is
// no multiple of 8, x and dy of different dtypes): 25 jobs, 2.0 M
// elements.
func selfCheckJobs() []computetest.Job {
	f32 := computetest.Mix{}
	bf16 := computetest.Mix{X: compute.BF16, W: compute.BF16, DY: compute.BF16, DX: compute.BF16, DW: compute.BF16}
	f16 := computetest.Mix{X: compute.F16, W: compute.F32, DY: compute.F16, DX: compute.F16, DW: compute.F32}
	anyMix := computetest.Mix{X: compute.BF16, W: compute.F32, DY: compute.F32, DX: compute.BF16, DW: compute.F32}
	var jobs []computetest.Job
	add := func(rows, dim int, m computetest.Mix) {
		jobs = append(jobs, computetest.NewJob(uint64(len(jobs)+1)*7919, rows, dim).WithMix(m))
	}
	for _, dim := range []int{1024, 2048, 3072, 4096, 4352, 6144, 8192} {
		add(3, dim, f32)
	}
	add(5, 1024, bf16) // c7
	add(5, 896, f16)   // c7's F16 kernel
	add(5, 2048, bf16) // c12
	add(5, 1536, f16)  // c12's F16 kernel
	add(5, 4096, bf16)
	add(5, 5120, bf16)  // c9
	add(3, 4608, f16)   // c9's F16 kernel
	add(3, 6144, f16)   // c10
	add(3, 8192, f16)   // c11
	add(64, 4096, f32)  // several groups, the reduction
	add(96, 4352, f32)  // several groups, w and dw in shared memory
	add(64, 8192, bf16) // the same, chunks of 8
	add(48, 5376, bf16) // the same, one row a barrier (c10)
	add(64, 3072, f16)  // the same, two chunks a thread (c8)
	add(64, 1152, bf16) // the same, c12
	add(5, 257, f32)
	add(5, 1028, bf16)
	add(4, 4096, anyMix)
	return jobs
}

// selfCheck runs selfCheckJobs on the backend, in one command buffer, and
// compares each output with the float64 oracle (computetest.Job.Check: the
// tolerance of the conformance suite), then runs them again recorded in
// the reverse order and requires the same bits. The kernels are compiled at Open
// for whatever GPU the host has, and only some GPUs are ever tested: a
// compiler or device that computes wrong values is refused here, at start,
// with the job, its dtypes and the first wrong element named, instead of
// writing wrong gradients. Both failures wrap compute.ErrUnsupported, so
// backend: auto moves on to the CPU (saying why) and backend: cuda stops
// the worker at start. RMSGRAD_CUDA_SELFCHECK=0 skips it.
func (b *Backend) selfCheck(ctx context.Context) error {
	if os.Getenv("RMSGRAD_CUDA_SELFCHECK") == "0" {
		return nil
	}
	t0 := time.Now()
	if err := selfCheck(ctx, b, b.device); err != nil {
		return err
	}
	b.selfCheckTime = time.Since(t0)
	return nil
}

// selfCheck is the check of (*Backend).selfCheck on any backend (the tests
// run it on the CPU backend and on broken ones).
func selfCheck(ctx context.Context, b compute.Backend, device string) error {
	jobs := selfCheckJobs()
	outs, err := computetest.RunJobs(ctx, b, jobs, computetest.DXThenDW)
	if err != nil {
		return fmt.Errorf("cuda: self-check on %s: running %d jobs: %w (%w)", device, len(jobs), err, compute.ErrUnsupported)
	}
	for i, j := range jobs {
		if err := j.Check(outs[i]); err != nil {
			return fmt.Errorf("cuda: self-check on %s: job %dx%d %s: %w (the kernels compiled for this GPU compute wrong values; RMSGRAD_CUDA_SELFCHECK=0 skips this check): %w",
				device, j.Rows, j.Dim, j.Mix, err, compute.ErrUnsupported)
		}
	}
	// The same jobs recorded in the reverse order (other table entries,
	// other blocks) must give the same bits: a race or an order that
	// depends on the batch shows here.
	again, err := computetest.RunJobs(ctx, b, jobs, computetest.Reversed)
	if err != nil {
		return fmt.Errorf("cuda: self-check on %s: running %d jobs again: %w (%w)", device, len(jobs), err, compute.ErrUnsupported)
	}
	for i, j := range jobs {
		if d := computetest.BitsEqual(outs[i], again[i]); d != "" {
			return fmt.Errorf("cuda: self-check on %s: job %dx%d %s gives other bits when the batch is recorded in another order: %s (RMSGRAD_CUDA_SELFCHECK=0 skips this check): %w",
				device, j.Rows, j.Dim, j.Mix, d, compute.ErrUnsupported)
		}
	}
	return nil
}
