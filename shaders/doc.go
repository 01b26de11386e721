// Package shaders holds the GPU kernel sources of rmsgrad, embedded into the
// binary, and the host-side launch geometry that goes with them.
//
// rms_norm_backward.metal (MetalSource) is compiled at start-up by the Metal
// backend; PlanMetal (metal_dispatch.go) turns a validated op list into the
// exact steps (dispatches with their threadgroups, threads, threadgroup
// memory and buffer bindings, barriers, command-buffer boundaries) that both
// the Metal backend and the msl-cpu backend (shaders/mslcpu, which runs the
// same source as C++ on the CPU) encode. Reading the .metal file with
// metal_dispatch.go tells the whole story of one job.
//
// rms_norm_backward.cu (CUDASource) is compiled by NVRTC in the cuda
// backend, whose cuda/plan.go is its dispatch.
package shaders
