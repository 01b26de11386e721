// Package mslcpu runs the Metal shader source on the CPU: it compiles the
// very file shaders/rms_norm_backward.metal as C++ with g++ against a shim of
// the MSL subset the shader uses (cxx/metal_stdlib), and executes each
// dispatch with real threadgroup semantics (one fiber per thread, real
// barriers and simdgroup exchanges, guard pages around every buffer). It is
// a compute.Backend named "msl-cpu", used to run the conformance suite
// against the shader's logic on Linux, where no Metal device exists.
//
// The launch plan is shaders.PlanMetal, the same function the Metal
// backend encodes, and the kernel glue is generated from the [[buffer(n)]]
// and built-in attributes in the source, so a binding the host gets wrong
// fails here as it would on a Mac.
//
// It proves the shader's arithmetic, indexing, reductions and barrier
// structure; it does not prove that Apple's compiler accepts the source, nor
// anything about GPU performance or unified memory. It needs g++ at run time
// and is a test backend, not a production one: each Execute starts the
// compiled driver process and streams the buffers through pipes.
package mslcpu
