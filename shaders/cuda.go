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
// flag sets of CUDARowsKernel (the general path, blocks of up to 512
// threads) over a job table; CUDARowsFusedKernels run the common case (r, dx
// and dw in one pass, dim a multiple of the chunk width up to 8192, x, dy
// and dx of one dtype), one kernel per width class of the register path
// (c0..c6 F32, c7..c12 BF16 and F16; a half class has a kernel per dtype:
// CUDARowsFusedKernels' for BF16, CUDARowsFusedF16Kernels' for F16);
// CUDAReduceKernel sums the dw partials; CUDAAddKernel is the c = a + b copy
// ceiling of the benchmarks, CUDASpinKernel their blocking kernel and
// CUDAFillKernel their input generator.
const (
	CUDARowsKernel   = "rms_norm_backward_rows_f32"
	CUDAReduceKernel = "rms_norm_dw_reduce_f32"
	CUDAAddKernel    = "rms_bench_add_f32"
	CUDASpinKernel   = "rms_bench_spin"
	CUDAFillKernel   = "rms_bench_fill"
)

// CUDARowsFusedKernels are the fused kernels of the register path's width
// classes c0..c12 (cuda/geometry.go has their geometry): F32 rows in c0..c6,
// BF16 rows in c7..c12.
var CUDARowsFusedKernels = [...]string{
	"rms_norm_backward_rows_fused_c0",
	"rms_norm_backward_rows_fused_c1",
	"rms_norm_backward_rows_fused_c2",
	"rms_norm_backward_rows_fused_c3",
	"rms_norm_backward_rows_fused_c4",
	"rms_norm_backward_rows_fused_c5",
	"rms_norm_backward_rows_fused_c6",
	"rms_norm_backward_rows_fused_c7",
	"rms_norm_backward_rows_fused_c8",
	"rms_norm_backward_rows_fused_c9",
	"rms_norm_backward_rows_fused_c10",
	"rms_norm_backward_rows_fused_c11",
	"rms_norm_backward_rows_fused_c12",
}

// CUDARowsFusedF16Kernels are the F16 kernels of the half classes c7..c12
// (the same geometry as their BF16 kernels in CUDARowsFusedKernels).
var CUDARowsFusedF16Kernels = [...]string{
	"rms_norm_backward_rows_fused_c7_f16",
	"rms_norm_backward_rows_fused_c8_f16",
	"rms_norm_backward_rows_fused_c9_f16",
	"rms_norm_backward_rows_fused_c10_f16",
	"rms_norm_backward_rows_fused_c11_f16",
	"rms_norm_backward_rows_fused_c12_f16",
}
