// Package cuda is the compute.Backend for Linux NVIDIA GPUs, with no cgo:
// libcuda.so.1 (the driver API) and libnvrtc are loaded at run time with
// purego, shaders/rms_norm_backward.cu is compiled by NVRTC for the device's
// own architecture (sm_XY from its compute capability) when Open runs, and
// kernels are launched with cuLaunchKernel.
//
// A buffer is a pinned host allocation (cuMemHostAlloc, so storage reads land
// in it directly and copies are truly asynchronous) paired with a device
// allocation (cuMemAlloc; never managed memory), both pooled by size so a
// steady-state worker allocates nothing (TestSteadyStateAllocatesNothing). A
// command buffer runs on one stream: uploads of the inputs no earlier op
// writes, the job table, then per phase (ops between barriers; stream order
// is the barrier) one launch of the rows kernel over every job of the phase
// and one launch of the dw reduction, downloads of everything written, one
// synchronize. A job's RMSInv, DX and DW are fused into one pass over its
// rows when the op list allows (plan.go); fused and unfused entries run the
// same arithmetic, so the bits are the same.
//
// The rows kernel uses persistent blocks (two per SM; a job's rows split
// into at most that many groups, a function of rows, dim and the device
// only). Rows whose dim is a multiple of 4 (up to 8192) stream through a
// ring of shared-memory row slots filled with 16-byte cp.async copies, so
// the next rows are in flight while one is reduced and written; other dims
// take a register path. dw comes from fp32 per-group partials and a fixed
// reduction tree: no float atomics, bitwise-identical results across runs
// and batch compositions. Execute returns the device time from the first
// upload to the last download; LastStats has the kernel time alone.
//
// Dtypes: x, w, dy, dx and dw may each be F32, BF16 or F16 (r and the dw
// partials are F32). The rows code is compiled for the dtype x, dy and dx
// share, with typed loads (4 halfs in one 8-byte load) and stores, and in a
// form that reads each tensor's dtype from the job entry for other mixes;
// all arithmetic is float32 in the same order, a half output the float32
// result rounded once to nearest even. Half x or dy take the register and
// streaming paths (no shared-memory slots).
//
// On a machine without the driver or a GPU, Open returns an error wrapping
// compute.ErrUnsupported that says why, and the worker falls back to cpu.
package cuda
