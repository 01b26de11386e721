// Package metal is the Metal compute backend of rmsgrad for Apple GPUs
// (macOS only), built on github.com/progrium/darwinkit v0.5.0.
//
// Open compiles shaders.MetalSource once (fast math off) into one pipeline
// per kernel, keeps one command queue, and hands out shared-storage
// (unified-memory) buffers whose Bytes and Float32s are the GPU memory
// itself, so storage reads land directly where the kernels read them.
// Released buffers go back to a pool keyed by length. Execute encodes a whole
// op list into one command buffer with one concurrent compute encoder:
// dispatches between two compute.OpBarrier entries may overlap, and each
// barrier is a memoryBarrierWithScope(buffers). Launch geometry comes from
// shaders.MetalPlan, the function the msl-cpu test backend uses too.
//
// On other platforms Open returns an error wrapping compute.ErrUnsupported.
//
// darwinkit v0.5.0 facts this package relies on (read from its source):
// there is no binding for MTLCreateSystemDefaultDevice (a cgo helper here
// calls it, falling back to MTLCopyAllDevices when it is nil, as under
// launchd or ssh); ComputeCommandEncoderObject has no EndEncoding (it is
// sent through CommandEncoderObject); and the generated wrappers that take
// protocol-typed arguments (SetComputePipelineState, SetBufferOffsetAtIndex_,
// NewComputePipelineStateWithFunctionError, MemoryBarrierWithResourcesCount)
// wrap them with objc.WrapAsProtocol, which panics for these objects, so
// those messages are sent with objc.Call and the selector.
package metal
