package shaders

import _ "embed"

// CUDASource is the CUDA C++ source of the RMSNorm-backward kernels, compiled
// by NVRTC at start-up by the cuda backend. Its entry points are
// CUDARowsKernel, CUDAReduceKernel and CUDAAddKernel.
//
//go:embed rms_norm_backward.cu
var CUDASource string

// CUDAFile is the file name of CUDASource, for NVRTC's program name and for
// messages.
const CUDAFile = "rms_norm_backward.cu"

// Entry points of CUDASource. The three compute kernels (rms_inv, dx, dw) are
// flag sets of CUDARowsKernel over a job table; CUDAReduceKernel sums the dw
// partials; CUDAAddKernel is the c = a + b copy ceiling of the benchmarks.
const (
	CUDARowsKernel   = "rms_norm_backward_rows_f32"
	CUDAReduceKernel = "rms_norm_dw_reduce_f32"
	CUDAAddKernel    = "rms_bench_add_f32"
)
