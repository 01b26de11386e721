// Package cuda is the compute.Backend for Linux NVIDIA GPUs, with no cgo:
// libcuda.so.1 (the driver API) and libnvrtc are loaded at run time with
// purego, shaders/rms_norm_backward.cu is compiled by NVRTC for the device's
// own architecture (sm_XY from its compute capability) when Open runs, and
// kernels are launched with cuLaunchKernel.
//
// A buffer is a pinned host allocation (cuMemHostAlloc, mapped into the
// device's address space, so storage reads land in it directly) paired with
// a device allocation (cuMemAlloc; never managed memory), both pooled by size
// so a steady-state worker allocates nothing
// (TestSteadyStateAllocatesNothing); Alloc and Release of pooled buffers make
// no driver call and do not wait for a running command buffer. With Reserve,
// the pinned part of new buffers is carved from one region pinned up front,
// until it is used up (TestReserve). PoolLimit bounds the pool as the
// other backends' (TestPoolLimit, on a fake driver). A command
// buffer runs on one stream: the job table (one copy), then per phase (ops
// between barriers; stream order is the barrier) one launch per rows kernel
// and block size over its jobs and one launch of the dw reduction, and one
// synchronize. Buffers of up to 1 MiB (RMSGRAD_CUDA_MAP_BYTES) are not
// copied: the kernels read and write them in their pinned host memory, so a
// batch of small jobs is one copy, one launch and a synchronize; larger
// ones are copied up and down, one copy each. A job's RMSInv, DX and DW are
// fused into one pass over its rows when the op list allows (plan.go); fused
// and unfused entries run the same arithmetic, so the bits are the same.
//
// The rows kernels use persistent blocks, as many as fit on the device at
// once (a job's rows split into that many groups, each at least 8192
// elements, so a small job is one block; a function of rows, dim and the
// device only). Dims that are a multiple of 4 up to 8192 hold each row and w
// in registers, in one of six width classes (1 to 4 chunks of 4 per thread,
// a block sized to the row, S rows held at once; BF16 and F16 held as
// loaded, two to a word); other dims take the general kernel (registers up
// to 1024 chunks, re-reading beyond). dw comes from fp32 per-group partials and a fixed reduction
// tree, or, for a job in one group, from the block itself: no float atomics,
// bitwise-identical results across runs and batch compositions. Execute
// returns the device time from the first copy to the last; LastStats has
// the kernel time alone and the host side.
//
// Dtypes: x, w, dy, dx and dw may each be F32, BF16 or F16 (r and the dw
// partials are F32). The rows code is compiled for the dtype x, dy and dx
// share, with typed loads (4 halfs in one 8-byte load) and stores, and in a
// form that reads each tensor's dtype from the job entry for other mixes;
// all arithmetic is float32 in the same order, a half output the float32
// result rounded once to nearest even.
//
// On a machine without the driver or a GPU, Open returns an error wrapping
// compute.ErrUnsupported that says why, and the worker falls back to cpu.
package cuda
