package shaders

import _ "embed"

// MetalSource is the MSL source of the Metal kernels (MetalKernels), which
// run compute.KernelRMSInv, compute.KernelDX and compute.KernelDW, fused or
// apart (PlanMetal).
//
//go:embed rms_norm_backward.metal
var MetalSource string

// MetalFile is the file name of MetalSource, for messages and for tools that
// write the source out (the msl-cpu build).
const MetalFile = "rms_norm_backward.metal"
