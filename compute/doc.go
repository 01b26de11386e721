// Package compute is the backend-neutral core of rmsgrad: f32 buffers with a
// shape, the three RMSNorm-backward kernels named as in the Metal shader, and
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
// r is computed once by KernelRMSInv and read by both KernelDX and KernelDW,
// so a barrier must separate them. Every dispatch is validated here, before a
// backend sees it, so all backends reject exactly the same arguments with the
// same typed errors (*ArgError, matched with errors.Is against
// ErrInvalidArgument).
//
// Backends (compute/cpu, metal, cuda) implement Backend; they never import
// jobs or storage.
package compute
