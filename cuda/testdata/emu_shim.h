// The CUDA device built-ins, as the CPU emulators of the CUDA kernels need
// them (testdata/kernel_emu.cpp for shaders/rms_norm_backward.cu,
// variants/rows_emu.cpp for the kernel-geometry harness): one std::thread
// per CUDA thread, blocks run one after another (launch), real barriers
// for __syncthreads and the warp shuffles (an exchange through a per-warp
// buffer), CUDA's round-to-nearest intrinsics as IEEE float operations.
//
// cp.async is emulated per thread: the copies of the open group and the
// committed groups not yet waited for. Eager copies land when issued (a
// slot overwritten while a thread still reads it shows); late ones only
// when emu_cp_wait lets their group (a slot read before its wait shows).
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
#define __launch_bounds__(...)
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
struct dim3 { unsigned x, y, z; };
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
template <class T> T __ldg(const T* p) { return *p; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline std::barrier<>* g_bar;
inline std::barrier<>* g_warp[16];
inline float g_wbuf[16][32];
inline void __syncthreads() { g_bar->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
	const int t = threadIdx.x, w = t >> 5, l = t & 31;
	g_wbuf[w][l] = v;
	g_warp[w]->arrive_and_wait();
	const float r = g_wbuf[w][l ^ o];
	g_warp[w]->arrive_and_wait();
	return r;
}

struct EmuCopy { void* s; const void* g; };
inline bool g_eager;                 // copies land when issued (else when waited for)
inline std::atomic<bool> g_leak{false}; // a block ended with copies not waited for
inline thread_local std::vector<EmuCopy> t_open;
inline thread_local std::vector<std::vector<EmuCopy>> t_groups;
inline void emu_cp16(void* s, const void* g) {
	if (g_eager) std::memcpy(s, g, 16);
	else t_open.push_back({s, g});
}
inline void emu_cp_commit() {
	t_groups.push_back(t_open);
	t_open.clear();
}
// emu_cp_wait lands the oldest groups until at most n are pending.
inline void emu_cp_wait(int n) {
	while ((int)t_groups.size() > n) {
		for (const EmuCopy& c : t_groups.front()) std::memcpy(c.s, c.g, 16);
		t_groups.erase(t_groups.begin());
	}
}

// launch runs blocks blocks of threads threads one block after another,
// with gridDim and blockDim set; a thread that ends a block with copies
// not waited for sets g_leak.
inline void launch(int blocks, int threads, const std::function<void()>& k) {
	std::barrier<> bar(threads);
	g_bar = &bar;
	blockDim = {(unsigned)threads, 1, 1};
	gridDim = {(unsigned)blocks, 1, 1};
	const int warps = threads / 32;
	for (int w = 0; w < warps; w++) g_warp[w] = new std::barrier<>(32);
	std::vector<std::thread> th;
	for (int t = 0; t < threads; t++)
		th.emplace_back([&, t] {
			for (int b = 0; b < blocks; b++) {
				threadIdx = {(unsigned)t, 0, 0};
				blockIdx = {(unsigned)b, 0, 0};
				k();
				if (!t_open.empty() || !t_groups.empty()) g_leak = true;
				t_open.clear();
				t_groups.clear();
				bar.arrive_and_wait();
			}
		});
	for (auto& x : th) x.join();
	for (int w = 0; w < warps; w++) delete g_warp[w];
}
