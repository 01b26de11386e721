package compute

import (
	"encoding/binary"
	"math"

	"github.com/rmsgrad/rmsgrad/compute/half"
)

// Kernel is the stable name of a compute kernel. The same strings name the
// functions in shaders/rms_norm_backward.metal and .cu, the pipeline cache
// keys, the test names and the metric labels.
type Kernel string

// The three RMSNorm-backward kernels. A name's "_f32" says the arithmetic
// is float32; it names the operation, not its buffers' dtypes: every kernel
// takes any mix of DTypes (see DType).
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

// DType is the element type of a buffer, named as safetensors names it.
//
// The kernels read x, w and dy and write dx and dw in any of DTypes, each
// buffer in its own (Buffer.DType says which; the kernel names stay the
// same for every mix); r is always F32. Whatever the dtypes, the
// arithmetic and every reduction run in float32 in the same order: half
// inputs are widened exactly, and a half output is the float32 result
// rounded once, to nearest even (compute/half defines every bit).
type DType string

// The dtypes the kernels compute.
const (
	F32  DType = "F32"  // IEEE 754 binary32
	BF16 DType = "BF16" // bfloat16: float32's exponent, 7 mantissa bits
	F16  DType = "F16"  // IEEE 754 binary16
)

// DTypes lists the dtypes every backend computes, F32 first.
var DTypes = []DType{F32, BF16, F16}

// Size returns the size in bytes of one element, or 0 for a dtype not in
// DTypes.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	}
	return 0
}

// Valid reports whether d is one of DTypes.
func (d DType) Valid() bool { return d.Size() != 0 }

// Encode writes v as little-endian elements of d into dst, which must be
// len(v)*d.Size() bytes: float32s as they are, half types rounded to
// nearest even (compute/half). It panics for a dtype not in DTypes.
func (d DType) Encode(dst []byte, v []float32) {
	switch d {
	case F32:
		dst = dst[:4*len(v)]
		for i, f := range v {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
		}
	case BF16:
		half.EncodeBF16(dst, v)
	case F16:
		half.EncodeF16(dst, v)
	default:
		panic("compute: Encode: dtype " + string(d) + " is not computed")
	}
}

// Decode sets dst from the little-endian elements of d in src, which must
// be len(dst)*d.Size() bytes; exact for every dtype. It panics for a dtype
// not in DTypes.
func (d DType) Decode(dst []float32, src []byte) {
	switch d {
	case F32:
		src = src[:4*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case BF16:
		half.DecodeBF16(dst, src)
	case F16:
		half.DecodeF16(dst, src)
	default:
		panic("compute: Decode: dtype " + string(d) + " is not computed")
	}
}

// Round returns f rounded to d (f itself for F32), as the kernels round an
// output of dtype d.
func (d DType) Round(f float32) float32 {
	switch d {
	case BF16:
		return half.BF16ToFloat32(half.Float32ToBF16(f))
	case F16:
		return half.F16ToFloat32(half.Float32ToF16(f))
	}
	return f
}
