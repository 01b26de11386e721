// cuda_bf16.h's host conversions that cuda/variants/rows.cu uses, declared
// only (cuda.TestVariantsCompile).
#pragma once
#include "cuda_runtime.h"
struct __nv_bfloat16 { unsigned short x; };
__host__ __device__ __nv_bfloat16 __float2bfloat16_rn(float f);
__host__ __device__ float __bfloat162float(__nv_bfloat16 b);
