package shaders

import _ "embed"

// CUDASource is the CUDA C++ source of the RMSNorm-backward kernels, compiled
// by NVRTC at start-up by the cuda backend. Its entry points are
// the rows kernels (CUDARowsKernel and its wide and fused forms),
// CUDAReduceKernel, CUDAAddKernel and CUDASpinKernel.
//
//go:embed rms_norm_backward.cu
var CUDASource string

// CUDAFile is the file name of CUDASource, for NVRTC's program name and for
// messages.
const CUDAFile = "rms_norm_backward.cu"

// Entry points of CUDASource. The three compute kernels (rms_inv, dx, dw) are
// flag sets of CUDARowsKernel (256 threads per block) or, for dims from 4100
// to 8192 that are a multiple of 4, CUDARowsWideKernel (512) over a job
// table; the Fused forms run the common case (r, dx and dw in one pass, dim a
// multiple of 4) compiled apart; CUDAReduceKernel sums the dw
// partials; CUDAAddKernel is the c = a + b copy ceiling of the benchmarks and
// CUDASpinKernel their blocking kernel.
const (
	CUDARowsKernel          = "rms_norm_backward_rows_f32"
	CUDARowsWideKernel      = "rms_norm_backward_rows512_f32"
	CUDARowsFusedKernel     = "rms_norm_backward_rows_fused_f32"
	CUDARowsWideFusedKernel = "rms_norm_backward_rows512_fused_f32"
	CUDAReduceKernel        = "rms_norm_dw_reduce_f32"
	CUDAAddKernel           = "rms_bench_add_f32"
	CUDASpinKernel          = "rms_bench_spin"
)
