// mslcpu_runtime.h: the interface between the msl-cpu driver (driver.cpp),
// the MSL shim (metal_stdlib) and the generated kernel glue. No MSL macros
// here, so the driver can include standard headers freely.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mslcpu {

struct dim3 {
    unsigned x, y, z;
};

// The built-in argument values of one thread ([[thread_position_in_threadgroup]] ...).
struct ThreadIds {
    dim3 tg_pos;       // threadgroup_position_in_grid
    dim3 tgs_per_grid; // threadgroups_per_grid
    dim3 lid;          // thread_position_in_threadgroup
    dim3 tpg;          // threads_per_threadgroup
    dim3 gid;          // thread_position_in_grid
    unsigned lidx;     // thread_index_in_threadgroup
    unsigned lane;     // thread_index_in_simdgroup
    unsigned sg;       // simdgroup_index_in_threadgroup
    unsigned nsg;      // simdgroups_per_threadgroup
    unsigned tps;      // threads_per_simdgroup
};

// One dispatch's bound resources: buffer[n] is [[buffer(n)]] (device memory
// or inline constant bytes), tgmem[n] is [[threadgroup(n)]].
struct Launch;
using KernelFn = void (*)(const Launch&, const ThreadIds&);

constexpr int kMaxBuffers = 31; // Metal's buffer argument table size
constexpr int kMaxTGMem = 8;

struct Launch {
    void* buffer[kMaxBuffers];
    void* tgmem[kMaxTGMem];
    KernelFn fn;
};

// One entry of the generated kernel table: what the shader source declares,
// checked against what the host binds.
struct KernelInfo {
    const char* name;
    KernelFn fn;
    int nbuffers;
    int buffer_index[kMaxBuffers];
    size_t buffer_ref_size[kMaxBuffers]; // sizeof(T) for `constant T&`, 0 for pointers
    int ntgmem;
};
extern const KernelInfo kKernels[];
extern const int kNumKernels;

// The SIMD width of this run (the request's; 8, 16, 32 or 64), which the
// driver's scheduler and the shim's simd operations use.
extern unsigned g_simd_width;

// Synchronisation points (driver.cpp). Every thread of the threadgroup must
// reach the same kind of point; the scheduler aborts the run otherwise.
enum SyncKind : int { kSyncBarrier = 1, kSyncSimd = 2 };
void sync_point(SyncKind kind);
// Publishes v for this thread, waits for every thread of the threadgroup,
// and returns this thread's simdgroup's g_simd_width published values.
const float* simd_exchange(float v);
// The current thread's simdgroup lane.
unsigned current_lane();

} // namespace mslcpu
