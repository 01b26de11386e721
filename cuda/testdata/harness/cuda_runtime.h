// The CUDA runtime API that cuda/variants/rows.cu (the kernel-geometry
// harness) uses, declared only, for cuda.TestVariantsCompile: clang's CUDA
// front end checks the harness's host and device code without a CUDA
// toolkit (nothing is linked or run). Built-ins come from
// ../clang_cuda_shim.h.
#pragma once
#include "../clang_cuda_shim.h"
#include <stddef.h>
#include <stdlib.h>
struct dim3 {
	unsigned x, y, z;
	__host__ __device__ dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef int cudaError_t;
#define cudaSuccess 0
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUstream_st* cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct cudaDeviceProp { char name[256]; int multiProcessorCount; int l2CacheSize; };
struct cudaFuncAttributes { int numRegs; size_t localSizeBytes; size_t sharedSizeBytes; };
extern "C" {
unsigned __cudaPushCallConfiguration(dim3 g, dim3 b, size_t s = 0, void* st = 0);
int cudaConfigureCall(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0);
cudaError_t cudaMalloc(void** p, size_t n);
cudaError_t cudaFree(void* p);
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t st = 0);
cudaError_t cudaMemset(void* d, int v, size_t n);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaGetLastError(void);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
cudaError_t cudaFuncSetAttribute(const void* f, cudaFuncAttribute a, int v);
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void* f);
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void* f, int threads, size_t smem);
}
template <class T> inline cudaError_t cudaMalloc(T** p, size_t n) { return cudaMalloc((void**)p, n); }
__device__ inline size_t __cvta_generic_to_shared(const void* p) { return (size_t)p; }
