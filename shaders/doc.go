// Package shaders holds the GPU kernel sources of rmsgrad, embedded into the
// binary, and the host-side launch geometry that goes with them.
//
// rms_norm_backward.metal (MetalSource) is compiled at start-up by the Metal
// backend; MetalPlan turns one validated compute.Op into the exact dispatch
// (threadgroups, threads, threadgroup memory, buffer indices) that both the
// Metal backend and the msl-cpu backend (shaders/mslcpu, which runs the same
// source as C++ on the CPU) encode. Reading the .metal file with
// metal_dispatch.go tells the whole story of one op.
package shaders
