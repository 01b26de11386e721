// The CUDA built-ins shaders/rms_norm_backward.cu uses, for compiling it
// with clang's CUDA front end and no CUDA toolkit (cuda.TestKernelsCompile:
// clang -x cuda -nocudainc -nocudalib --cuda-device-only). NVRTC has these
// built in; here they map to clang's NVPTX builtins with the same rounding
// (or, for __ldg, to a plain load: only the front end's checks matter).
#include <__clang_cuda_builtin_vars.h>
#include <stddef.h>
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#define __restrict__ __restrict
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
__device__ inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
__device__ inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
__device__ inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
template <class T> __device__ inline T __ldg(const T* p) { return *p; }
__device__ inline float __shfl_xor_sync(unsigned m, float v, int o) { return __nvvm_shfl_sync_bfly_f32(m, v, o, 0x1f); }
__device__ inline float __fadd_rn(float a, float b) { return __nvvm_add_rn_f(a, b); }
__device__ inline float __fmul_rn(float a, float b) { return __nvvm_mul_rn_f(a, b); }
__device__ inline float __fmaf_rn(float a, float b, float c) { return __nvvm_fma_rn_f(a, b, c); }
__device__ inline float __fdiv_rn(float a, float b) { return __nvvm_div_rn_f(a, b); }
__device__ inline float __frcp_rn(float a) { return __nvvm_rcp_rn_f(a); }
__device__ inline float __fsqrt_rn(float a) { return __nvvm_sqrt_rn_f(a); }
__device__ inline float __uint_as_float(unsigned u) { return __builtin_bit_cast(float, u); }
__device__ inline unsigned __float_as_uint(float f) { return __builtin_bit_cast(unsigned, f); }
