package compute

// Kernel is the stable name of a compute kernel. The same strings name the
// functions in shaders/rms_norm_backward.metal and .cu, the pipeline cache
// keys, the test names and the metric labels.
type Kernel string

// The three RMSNorm-backward kernels.
const (
	// KernelRMSInv computes r[rows] = rsqrt(mean(x[b,:]^2) + eps).
	KernelRMSInv Kernel = "rms_norm_compute_rms_inv_f32"
	// KernelDX computes dx[rows, dim] from x, w, dy and r.
	KernelDX Kernel = "rms_norm_backward_dx_f32"
	// KernelDW computes dw[dim] from x, dy and r.
	KernelDW Kernel = "rms_norm_backward_dw_f32"
)

// Kernels lists every kernel a backend must provide.
var Kernels = []Kernel{KernelRMSInv, KernelDX, KernelDW}

// DType is the element type of a buffer. Only F32 is computed today; the
// others exist so that buffers holding them are rejected with a clear error.
type DType string

// Supported and recognised element types.
const (
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
)

// Size returns the size in bytes of one element, or 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	}
	return 0
}
