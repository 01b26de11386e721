// Package compute is the backend-neutral core of rmsgrad: typed buffers with
// a shape, the three RMSNorm-backward kernels named as in the Metal shader, and
// a CommandBuffer that records validated dispatches and memory barriers and
// hands them to a Backend in one Execute call.
//
// The math (x is [rows, dim], w is [dim], dy is [rows, dim]):
//
//	r[b]    = 1 / sqrt(mean_i(x[b,i]^2) + eps)
//	s[b]    = sum_i dy[b,i] * x[b,i] * w[i]
//	dx[b,k] = r[b] * (dy[b,k]*w[k] - x[b,k] * s[b] * r[b]^2 / dim)
//	dw[i]   = sum_b dy[b,i] * x[b,i] * r[b]
//
// Dtypes: x, w, dy, dx and dw are each F32, BF16 or F16, independently
// (DTypes); a backend reads each buffer's dtype from Buffer.DType of the
// op's buffers (Op.X, Op.W, ...), the kernel names do not change. r is
// always F32. The arithmetic and every reduction are float32, in the same
// order whatever the dtypes: half inputs are widened exactly, and a half
// output is the float32 result rounded once to nearest even, NaN kept NaN
// and overflow to Inf, bit for bit as package compute/half defines it (so
// a half output is exactly DType.Round of the F32 output the same job
// gives). A dtype outside DTypes, or an r that is not F32, is an *ArgError
// naming the kernel, the argument ("x dtype", "r dtype", ...) and the
// dtype.
//
// r is computed once by KernelRMSInv and read by both KernelDX and KernelDW,
// so a barrier must separate them. Every dispatch is validated here, before a
// backend sees it, so all backends reject exactly the same arguments with the
// same typed errors (*ArgError, matched with errors.Is against
// ErrInvalidArgument).
//
// Backends (compute/cpu, metal, cuda) implement Backend; they never import
// jobs or storage.
package compute
