// The CUDA device built-ins, as the CPU emulators of the CUDA kernels need
// them (testdata/kernel_emu.cpp for shaders/rms_norm_backward.cu,
// variants/rows_emu.cpp for the kernel-geometry harness): one fiber (a
// user-space context with its own stack) per CUDA thread, all of a launch's
// fibers on the calling OS thread, blocks run one after another (launch),
// real barriers for __syncthreads and the warp shuffles (an exchange
// through a per-warp buffer), CUDA's round-to-nearest intrinsics as IEEE
// float operations. A fiber runs until it waits at a barrier; the
// scheduler runs each warp as far as it can go before the next (launch).
// A barrier that can never fill (threads waiting at different barriers,
// or some ended: a divergent __syncthreads) ends the run with a message
// naming it, where OS threads would hang. Fibers switch in user space, so
// a barrier of 256 threads costs microseconds; with one std::thread per
// CUDA thread a run spent most of its time in futex waits on two cores.
//
// cp.async is emulated per thread: the copies of the open group and the
// committed groups not yet waited for. Eager copies land when issued (a
// slot overwritten while a thread still reads it shows); late ones only
// when emu_cp_wait lets their group (a slot read before its wait shows).
#pragma once
#include <sys/mman.h>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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
inline dim3 threadIdx, blockIdx; // the running fiber's, set at each switch
inline dim3 blockDim, gridDim;
template <class T> T __ldg(const T* p) { return *p; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
struct EmuCopy { void* s; const void* g; };

// The switch between fibers, shared with the Metal shader's CPU runner:
// assembly on x86-64, ucontext elsewhere or with FIBER_UCONTEXT defined.
#include "../../shaders/mslcpu/cxx/fiber_switch.h"

// A fiber: a CUDA thread of the launch in progress.
struct EmuFiber {
	FiberCtx ctx;
	char* stack;       // emuStack bytes above a guard page (emu_stack)
	dim3 tid, bid;
	int state;         // emuRun, emuWait, emuDone
	int bar;           // the barrier waited at (emuWait)
	unsigned phase;    // its phase when the fiber arrived
	std::vector<EmuCopy> open;                // cp.async: the open group
	std::vector<std::vector<EmuCopy>> groups; // committed, not waited for
};
enum { emuRun, emuWait, emuDone };
// Barrier 0 is the block's (__syncthreads and the end of each block), 1+w
// warp w's. A barrier fills when n fibers have arrived; its phase then
// advances, which lets the fibers waiting at it go on.
struct EmuBar { int count; unsigned phase; int kind; };
// What a fiber arrives at barrier 0 for: a __syncthreads or the end of its
// block. A phase that mixes the two is a __syncthreads some threads of
// the block never reach (they returned): an error here, however a GPU
// counts threads that have exited.
enum { emuSync = 1, emuEnd = 2 };
constexpr int emuMaxThreads = 1024;
constexpr size_t emuStack = 256 << 10; // kernels keep rows in locals; pages touched only as used
inline EmuFiber g_fib[emuMaxThreads];
inline EmuBar g_bars[1 + emuMaxThreads / 32];
inline int g_cur;            // the running fiber
inline int g_blocks;
inline const std::function<void()>* g_kernel;
inline FiberCtx g_sched;

// emu_stack maps a fiber's stack with an inaccessible page below it, so
// that a stack overflow faults instead of writing over other memory.
inline char* emu_stack() {
	const size_t guard = 64 << 10; // a multiple of any page size in use
	void* p = mmap(nullptr, guard + emuStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED || mprotect(p, guard, PROT_NONE) != 0) {
		std::perror("emu: fiber stack");
		std::abort();
	}
	return static_cast<char*>(p) + guard;
}

// emu_exit2 ends the process with status 2 at once, from a fiber's stack
// too: no static destructors run under the fibers still in use.
[[noreturn]] inline void emu_exit2() {
	std::fflush(stdout);
	std::fflush(stderr);
	std::_Exit(2);
}

// emu_arrive waits at barrier id until n fibers have arrived at it, for
// kind (barrier 0; 0 for the warps' barriers).
inline void emu_arrive(int id, int n, int kind = 0) {
	EmuBar& b = g_bars[id];
	if (b.count == 0) b.kind = kind;
	if (b.kind != kind) {
		std::fprintf(stderr, "emu: divergent __syncthreads: in block %u thread %u %s while %d of the block's threads wait %s\n",
		             blockIdx.x, threadIdx.x, kind == emuEnd ? "ended" : "reached a __syncthreads", b.count,
		             kind == emuEnd ? "at a __syncthreads" : "at the block's end");
		emu_exit2();
	}
	if (++b.count == n) {
		b.count = 0;
		b.phase++;
		return;
	}
	EmuFiber& f = g_fib[g_cur];
	f.state = emuWait;
	f.bar = id;
	f.phase = b.phase;
	fiber_switch(f.ctx, g_sched);
}

inline float g_wbuf[emuMaxThreads / 32][32];
inline void __syncthreads() { emu_arrive(0, (int)blockDim.x, emuSync); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
	const int t = threadIdx.x, w = t >> 5, l = t & 31;
	g_wbuf[w][l] = v;
	emu_arrive(1 + w, 32);
	const float r = g_wbuf[w][l ^ o];
	emu_arrive(1 + w, 32);
	return r;
}

inline bool g_eager;      // copies land when issued (else when waited for)
inline bool g_leak;       // a block ended with copies not waited for
inline void emu_cp16(void* s, const void* g) {
	if (g_eager) std::memcpy(s, g, 16);
	else g_fib[g_cur].open.push_back({s, g});
}
inline void emu_cp_commit() {
	EmuFiber& f = g_fib[g_cur];
	f.groups.push_back(f.open);
	f.open.clear();
}
// emu_cp_wait lands the oldest groups until at most n are pending.
inline void emu_cp_wait(int n) {
	EmuFiber& f = g_fib[g_cur];
	while ((int)f.groups.size() > n) {
		for (const EmuCopy& c : f.groups.front()) std::memcpy(c.s, c.g, 16);
		f.groups.erase(f.groups.begin());
	}
}

// emu_fiber is a fiber's life: every block of the launch in turn, as a CUDA
// thread of a block that stays resident would run them, each ended at the
// block's barrier (barrier 0, as __syncthreads; a phase that mixes the two
// ends the run).
inline void emu_fiber(int t) {
	EmuFiber& f = g_fib[t];
	for (int b = 0; b < g_blocks; b++) {
		f.bid = blockIdx = {(unsigned)b, 0, 0};
		(*g_kernel)();
		if (!f.open.empty() || !f.groups.empty()) g_leak = true;
		f.open.clear();
		f.groups.clear();
		emu_arrive(0, (int)blockDim.x, emuEnd);
	}
	f.state = emuDone;
}

// emu_start is where a fiber's first switch lands: it runs the fiber
// (g_cur, set by the scheduler) and switches back for good.
inline void emu_start() {
	const int t = g_cur;
	emu_fiber(t);
	fiber_switch(g_fib[t].ctx, g_sched);
	std::abort(); // never resumed once done
}

// launch runs blocks blocks of threads threads one block after another,
// with gridDim and blockDim set; a thread that ends a block with copies
// not waited for sets g_leak. A barrier that cannot fill ends the process
// (exit status 2) with a message.
inline void launch(int blocks, int threads, const std::function<void()>& k) {
	if (threads < 1 || threads > emuMaxThreads || threads % 32 != 0) {
		std::fprintf(stderr, "emu: launch of %d threads a block: want a multiple of 32 up to %d\n", threads, emuMaxThreads);
		emu_exit2();
	}
	blockDim = {(unsigned)threads, 1, 1};
	gridDim = {(unsigned)blocks, 1, 1};
	g_blocks = blocks;
	g_kernel = &k;
	for (EmuBar& b : g_bars) b = {0, 0, 0};
	for (int t = 0; t < threads; t++) {
		EmuFiber& f = g_fib[t];
		if (f.stack == nullptr) f.stack = emu_stack();
		fiber_init(f.ctx, f.stack, emuStack, emu_start);
		f.tid = {(unsigned)t, 0, 0};
		f.bid = {0, 0, 0};
		f.state = emuRun;
		f.open.clear();
		f.groups.clear();
	}
	// Run ahead, as far as CUDA allows: each warp runs, through its
	// shuffles, until every lane waits at the block barrier or has ended,
	// before the next warp starts; only the block barrier makes warps wait
	// for each other. A missing __syncthreads so shows as a read of what
	// another warp has not yet written (in the forward order when the
	// reader is the lower warp, in the reverse order when it is the
	// higher one: the tests run both, RMS_EMU_ORDER=reverse).
	static const bool rev = [] {
		const char* o = std::getenv("RMS_EMU_ORDER");
		return o != nullptr && std::strcmp(o, "reverse") == 0;
	}();
	const int warps = threads / 32;
	auto runnable = [](const EmuFiber& f) {
		return f.state == emuRun || (f.state == emuWait && g_bars[f.bar].phase != f.phase);
	};
	for (int done = 0; done < threads;) {
		bool ran = false;
		for (int wi = 0; wi < warps; wi++) {
			const int w = rev ? warps - 1 - wi : wi;
			for (bool again = true; again;) {
				again = false;
				for (int li = 0; li < 32; li++) {
					const int t = w * 32 + (rev ? 31 - li : li);
					EmuFiber& f = g_fib[t];
					if (!runnable(f)) continue;
					f.state = emuRun;
					g_cur = t;
					threadIdx = f.tid;
					blockIdx = f.bid;
					fiber_switch(g_sched, f.ctx);
					ran = again = true;
					if (f.state == emuDone) done++;
				}
			}
		}
		if (!ran) {
			int first = 0;
			while (g_fib[first].state == emuDone) first++;
			const EmuFiber& f = g_fib[first];
			std::fprintf(stderr, "emu: deadlock in a launch of %d blocks of %d threads: thread %u of block %u waits at %s %d, %d of %d done\n",
			             blocks, threads, f.tid.x, f.bid.x, f.bar == 0 ? "the block barrier" : "the barrier of warp", f.bar == 0 ? 0 : f.bar - 1, done, threads);
			emu_exit2();
		}
	}
}
