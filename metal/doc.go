// Package metal is the Metal compute backend of rmsgrad for Apple GPUs
// (macOS, built with cgo), on github.com/progrium/darwinkit v0.5.0.
//
// Open compiles shaders.MetalSource once (fast math off) into a pipeline
// per kernel function, checks that the GPU suits the kernels (a SIMD width
// from 8 to 64, enough threads per threadgroup; anything else is
// compute.ErrUnsupported naming the GPU, so backend: auto moves on), keeps
// one command queue, and hands out shared-storage (unified-memory) buffers
// whose Bytes and Float32s are the GPU memory itself, so storage reads land
// directly where the kernels read them. Released buffers go back to a pool
// keyed by length, bounded by PoolLimit.
//
// Execute encodes the plan of shaders.PlanMetal (the function the msl-cpu
// test backend encodes too): per phase, one fused rows dispatch per job
// (r, dx and dw partials in one pass over each row), a barrier, the dw
// reductions, with memoryBarrierWithScope(buffers) at each barrier and one
// concurrent compute encoder per command buffer. A plan over
// MaxCommandBytes of traffic is split over several command buffers so
// none runs long enough for macOS to end it; a timeout that happens anyway
// is reported as such. Close waits for running Executes.
//
// On other platforms, and on macOS without cgo, Open returns an error
// wrapping compute.ErrUnsupported that says which is missing.
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
