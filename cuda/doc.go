// Package cuda is the compute.Backend for Linux NVIDIA GPUs, with no cgo:
// libcuda.so.1 (the driver API) and libnvrtc are loaded at run time with
// purego, shaders/rms_norm_backward.cu is compiled by NVRTC for the device's
// own architecture (sm_XY from its compute capability) when Open runs, and
// kernels are launched with cuLaunchKernel.
//
// A buffer is a pinned host allocation (cuMemHostAlloc, so storage reads land
// in it directly and copies are truly asynchronous) paired with a device
// allocation (cuMemAlloc; never managed memory), both pooled by size so a
// steady-state worker allocates nothing. A command buffer runs on one stream:
// uploads of its inputs, one job-table launch per kind of work between
// barriers (stream order is the barrier), the dw partial reduction, downloads
// of its outputs, one synchronize. A job's RMSInv, DX and DW are fused into
// one pass over its rows when the op list allows; the fused and unfused paths
// run the same instructions, so the bits are the same.
//
// On a machine without the driver or a GPU, Open returns an error wrapping
// compute.ErrUnsupported that says why, and the worker falls back to cpu.
package cuda
