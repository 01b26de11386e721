// driver.cpp: runs MSL compute kernels, compiled as C++ against the shim in
// metal_stdlib, on the CPU with real threadgroup semantics.
//
// Every thread of a threadgroup is a fiber with its own stack (switched by a
// few instructions of assembly on x86-64, by ucontext elsewhere:
// fiber_switch.h). The scheduler runs one simdgroup (W consecutive
// threads, W the request's SIMD width: 8, 16, 32 or 64) at a time,
// resuming its lanes in order; a lane runs until it reaches a synchronisation point
// (a simd operation, or threadgroup_barrier) or returns. A simdgroup keeps
// running through its simd operations until all its lanes wait at
// threadgroup_barrier or have returned; only then does the next simdgroup
// run, and only when every thread of the threadgroup is at the barrier does
// anyone pass it. That is the most run-ahead schedule Metal allows, so a
// missing barrier reads another simdgroup's threadgroup memory before it is
// written. Lanes of one simdgroup reaching different points, or threads
// returning while others wait at a barrier, abort the run: on a GPU that is
// undefined behaviour (wrong values or a hang), so the shader is wrong.
//
// Threadgroups are independent, so they are spread over worker OS threads,
// each with its own fibers; outputs do not depend on the thread count because
// each output element is written by exactly one thread of one threadgroup.
//
// Memory checks a GPU does not do: every device buffer and every threadgroup
// allocation ends exactly at a PROT_NONE guard page (and starts after one),
// so an out-of-bounds access past either end crashes the driver; threadgroup
// memory is filled with NaN before each threadgroup, so reading it before
// writing shows up in the results.
//
// Protocol (little-endian), request on stdin:
//   "MSLC" u32 version(2) u32 simd width
//   u32 nbuf; per buffer: u64 nbytes, bytes (a buffer of 0 bytes is the
//     placeholder for an argument the kernel must not touch: its data
//     starts at a guard page)
//   u32 nops; per op: u32 len, kernel name; u32 grid[3]; u32 threads[3];
//     u32 ntg, u32 tglen[ntg]; u32 nbind; per binding: u32 index, u32 kind
//     (0: u32 buffer id; 1: u32 len, inline bytes)
//     A kernel name "" is a memory barrier.
//   u32 nout, u32 buffer id[nout]
// Response on stdout: the bytes of each output buffer in order. Exit status
// 0 on success; otherwise a message on stderr.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fiber_switch.h"
#include "mslcpu_runtime.h"

namespace mslcpu {
namespace {

[[noreturn]] void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fputs("msl-cpu driver: ", stderr);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
    va_end(ap);
    std::fflush(stderr);
    _exit(2);
}

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// A block of n bytes that ends exactly at a guard page and starts after one.
struct Guarded {
    char* map = nullptr;
    size_t maplen = 0;
    char* data = nullptr;
    size_t n = 0;
};

Guarded guarded_alloc(size_t n) {
    Guarded g;
    g.n = n;
    const size_t body = (n + kPage - 1) / kPage * kPage;
    g.maplen = body + 2 * kPage;
    void* m = mmap(nullptr, g.maplen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap %zu bytes failed", g.maplen);
    g.map = static_cast<char*>(m);
    if (body > 0 && mprotect(g.map + kPage, body, PROT_READ | PROT_WRITE) != 0) die("mprotect failed");
    g.data = g.map + kPage + body - n;
    return g;
}

void guarded_free(Guarded& g) {
    if (g.map) munmap(g.map, g.maplen);
    g = Guarded{};
}

constexpr size_t kStack = 64 * 1024;

struct Fiber {
    FiberCtx ctx;
    Guarded stack;
    ThreadIds ids;
    bool done;
    int sync;
};

// The fibers of one worker thread, reused for every threadgroup it runs.
struct Group {
    FiberCtx sched;
    std::vector<Fiber> fibers;
    std::vector<float> slots[2];
    std::vector<Guarded> tgmem;
    Launch launch{}; // the threadgroup being run: its resources and fresh threadgroup memory
    Fiber* cur = nullptr;
    std::vector<unsigned> sgphase; // simd phases completed, per simdgroup

    ~Group() {
        for (auto& f : fibers) guarded_free(f.stack);
        for (auto& t : tgmem) guarded_free(t);
    }
};

thread_local Group* g_group = nullptr;

void fiber_entry() {
    Group* g = g_group;
    Fiber* f = g->cur;
    g->launch.fn(g->launch, f->ids);
    f->done = true;
    fiber_switch(f->ctx, g->sched);
    die("a finished fiber was resumed");
}

struct Op {
    std::string kernel; // "" = barrier
    const KernelInfo* info = nullptr;
    unsigned grid[3] = {1, 1, 1};
    unsigned threads[3] = {1, 1, 1};
    std::vector<uint32_t> tglen;
    struct Bind {
        uint32_t index;
        uint32_t kind;
        uint32_t buf;
        std::vector<char> bytes;
    };
    std::vector<Bind> binds;
};

// Runs threadgroup tg of op (resources in launch) on the calling worker.
void run_threadgroup(Group& g, const Op& op, const Launch& proto, unsigned tg) {
    const unsigned tx = op.threads[0], ty = op.threads[1], tz = op.threads[2];
    const unsigned n = tx * ty * tz;
    const unsigned gx = op.grid[0], gy = op.grid[1];
    const dim3 tgpos{tg % gx, (tg / gx) % gy, tg / (gx * gy)};

    if (g.fibers.size() < n) {
        size_t old = g.fibers.size();
        g.fibers.resize(n);
        for (size_t i = old; i < n; i++) g.fibers[i].stack = guarded_alloc(kStack);
    }
    if (g.slots[0].size() < n) {
        g.slots[0].assign(n, 0.0f);
        g.slots[1].assign(n, 0.0f);
    }
    // Fresh threadgroup memory contents: undefined in Metal, NaN here.
    // The launch is kept by value in the Group, which outlives this call
    // (a pointer to a local here is what GCC 13's -Wdangling-pointer, an
    // error under -Werror, rejects).
    g.launch = proto;
    for (size_t i = 0; i < op.tglen.size(); i++) {
        Guarded& t = g.tgmem[i];
        float* p = reinterpret_cast<float*>(t.data);
        for (size_t k = 0; k < t.n / sizeof(float); k++) p[k] = std::nanf("");
        g.launch.tgmem[i] = t.data;
    }

    for (unsigned i = 0; i < n; i++) {
        Fiber& f = g.fibers[i];
        ThreadIds& id = f.ids;
        id.tg_pos = tgpos;
        id.tgs_per_grid = dim3{op.grid[0], op.grid[1], op.grid[2]};
        id.lid = dim3{i % tx, (i / tx) % ty, i / (tx * ty)};
        id.tpg = dim3{tx, ty, tz};
        id.gid = dim3{tgpos.x * tx + id.lid.x, tgpos.y * ty + id.lid.y, tgpos.z * tz + id.lid.z};
        id.lidx = i;
        id.lane = i % g_simd_width;
        id.sg = i / g_simd_width;
        id.nsg = (n + g_simd_width - 1) / g_simd_width;
        id.tps = g_simd_width;
        f.done = false;
        f.sync = 0;
        fiber_init(f.ctx, f.stack.data, f.stack.n, fiber_entry);
    }

    // Adversarial but legal schedule: each simdgroup runs as far as it can
    // (through its simd operations) before the next one starts, and only a
    // threadgroup_barrier makes simdgroups wait for each other. A missing
    // barrier then shows up as a read of another simdgroup's not yet written
    // (NaN) threadgroup memory.
    const unsigned nsg = (n + g_simd_width - 1) / g_simd_width;
    if (g.sgphase.size() < nsg) g.sgphase.resize(nsg);
    std::fill(g.sgphase.begin(), g.sgphase.begin() + nsg, 0u);
    auto where = [&](int k) { return k == kSyncBarrier ? "threadgroup_barrier" : k == kSyncSimd ? "simd operation" : "kernel exit"; };
    for (;;) {
        unsigned nbarrier = 0, nexit = 0;
        for (unsigned s = 0; s < nsg; s++) {
            const unsigned lo = s * g_simd_width, hi = std::min(n, lo + g_simd_width);
            for (;;) {
                int kind = -1;
                for (unsigned i = lo; i < hi; i++) {
                    Fiber& f = g.fibers[i];
                    if (!f.done && f.sync != kSyncBarrier) {
                        g.cur = &f;
                        f.sync = 0;
                        fiber_switch(g.sched, f.ctx);
                    }
                    const int k = f.done ? 0 : f.sync;
                    if (kind == -1) kind = k;
                    if (k != kind)
                        die("%s threadgroup (%u,%u,%u) simdgroup %u: lane %u reached a %s, lane 0 a %s (divergent %s)",
                            op.kernel.c_str(), tgpos.x, tgpos.y, tgpos.z, s, i - lo, where(k), where(kind),
                            k == kSyncBarrier || kind == kSyncBarrier ? "barrier" : "simd operation");
                }
                if (kind != kSyncSimd) {
                    (kind == kSyncBarrier ? nbarrier : nexit) += hi - lo;
                    break;
                }
                g.sgphase[s]++;
            }
        }
        if (nbarrier == 0) break;
        if (nexit > 0)
            die("%s threadgroup (%u,%u,%u): %u threads exited while %u wait at a threadgroup_barrier (divergent barrier)",
                op.kernel.c_str(), tgpos.x, tgpos.y, tgpos.z, nexit, nbarrier);
        for (unsigned i = 0; i < n; i++) g.fibers[i].sync = 0;
    }
}

void read_exact(void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
        size_t k = std::fread(c, 1, n, stdin);
        if (k == 0) die("short request (%zu bytes missing)", n);
        c += k;
        n -= k;
    }
}

uint32_t read_u32() {
    uint32_t v;
    read_exact(&v, 4);
    return v;
}

uint64_t read_u64() {
    uint64_t v;
    read_exact(&v, 8);
    return v;
}

const KernelInfo* find_kernel(const std::string& name) {
    for (int i = 0; i < kNumKernels; i++)
        if (name == kKernels[i].name) return &kKernels[i];
    return nullptr;
}

// Checks the host's bindings against what the kernel's source declares.
void check_bindings(const Op& op, const std::vector<Guarded>& bufs) {
    const KernelInfo& k = *op.info;
    for (int d = 0; d < k.nbuffers; d++) {
        const int idx = k.buffer_index[d];
        const Op::Bind* b = nullptr;
        for (auto& x : op.binds)
            if (static_cast<int>(x.index) == idx) b = &x;
        if (!b) die("%s: [[buffer(%d)]] is not bound", k.name, idx);
        if (k.buffer_ref_size[d] != 0) {
            size_t got = b->kind == 1 ? b->bytes.size() : bufs[b->buf].n;
            if (got != k.buffer_ref_size[d])
                die("%s: [[buffer(%d)]] is a reference to %zu bytes, bound %zu bytes", k.name, idx,
                    k.buffer_ref_size[d], got);
        }
    }
    for (auto& x : op.binds) {
        bool declared = false;
        for (int d = 0; d < k.nbuffers; d++)
            if (k.buffer_index[d] == static_cast<int>(x.index)) declared = true;
        if (!declared) die("%s: binds [[buffer(%u)]], which the kernel does not declare", k.name, x.index);
    }
    if (static_cast<int>(op.tglen.size()) != k.ntgmem)
        die("%s: %zu threadgroup memory lengths set, kernel declares %d", k.name, op.tglen.size(), k.ntgmem);
    for (auto l : op.tglen)
        if (l % 16 != 0) die("%s: threadgroup memory length %u is not a multiple of 16", k.name, l);
    const unsigned n = op.threads[0] * op.threads[1] * op.threads[2];
    if (n == 0 || n > 1024) die("%s: %u threads per threadgroup (1..1024)", k.name, n);
    if (n % g_simd_width != 0) die("%s: %u threads per threadgroup is not whole simdgroups", k.name, n);
}

} // namespace

void sync_point(SyncKind kind) {
    Group* g = g_group;
    Fiber* f = g->cur;
    f->sync = kind;
    fiber_switch(f->ctx, g->sched);
}

const float* simd_exchange(float v) {
    Group* g = g_group;
    const ThreadIds& id = g->cur->ids;
    const unsigned p = g->sgphase[id.sg] & 1;
    g->slots[p][id.lidx] = v;
    sync_point(kSyncSimd);
    // Lanes read phase p's slots in phase p+1 of their simdgroup, which
    // writes slots[p^1] only.
    return &g_group->slots[p][id.sg * g_simd_width];
}

unsigned current_lane() { return g_group->cur->ids.lane; }

unsigned g_simd_width = 32;

} // namespace mslcpu

using namespace mslcpu;

int main() {
    char magic[4];
    read_exact(magic, 4);
    if (std::memcmp(magic, "MSLC", 4) != 0) die("bad request magic");
    if (read_u32() != 2) die("unsupported request version");
    g_simd_width = read_u32();
    if (g_simd_width < 4 || g_simd_width > 64 || (g_simd_width & (g_simd_width - 1)) != 0)
        die("SIMD width %u is not a power of two from 4 to 64", g_simd_width);

    std::vector<Guarded> bufs(read_u32());
    for (auto& b : bufs) {
        b = guarded_alloc(read_u64());
        read_exact(b.data, b.n);
    }
    std::vector<Op> ops(read_u32());
    for (auto& op : ops) {
        std::string name(read_u32(), '\0');
        read_exact(name.data(), name.size());
        op.kernel = name;
        for (auto& v : op.grid) v = read_u32();
        for (auto& v : op.threads) v = read_u32();
        op.tglen.resize(read_u32());
        if (op.tglen.size() > kMaxTGMem) die("too many threadgroup memory lengths");
        for (auto& v : op.tglen) v = read_u32();
        op.binds.resize(read_u32());
        for (auto& b : op.binds) {
            b.index = read_u32();
            b.kind = read_u32();
            if (b.index >= kMaxBuffers) die("buffer index %u out of range", b.index);
            if (b.kind == 0) {
                b.buf = read_u32();
                if (b.buf >= bufs.size()) die("buffer id %u out of range", b.buf);
            } else {
                b.bytes.resize(read_u32());
                read_exact(b.bytes.data(), b.bytes.size());
            }
        }
        if (op.kernel.empty()) continue;
        op.info = find_kernel(op.kernel);
        if (!op.info) die("no kernel named %s in the shader", op.kernel.c_str());
        check_bindings(op, bufs);
    }
    std::vector<uint32_t> outs(read_u32());
    for (auto& o : outs) {
        o = read_u32();
        if (o >= bufs.size()) die("output buffer id %u out of range", o);
    }

    unsigned nworkers = std::thread::hardware_concurrency();
    if (const char* e = std::getenv("MSLCPU_THREADS")) nworkers = static_cast<unsigned>(std::atoi(e));
    if (nworkers < 1) nworkers = 1;
    std::vector<Group> groups(nworkers);

    for (auto& op : ops) {
        // Ops run in order, so every barrier is honoured (and so is the
        // absence of one: nothing relies on ops overlapping).
        if (op.kernel.empty()) continue;
        Launch proto{};
        proto.fn = op.info->fn;
        for (auto& b : op.binds) {
            // Inline bytes are copied to their own guarded block too.
            proto.buffer[b.index] = b.kind == 0 ? static_cast<void*>(bufs[b.buf].data) : nullptr;
        }
        std::vector<Guarded> inl;
        for (auto& b : op.binds) {
            if (b.kind != 1) continue;
            inl.push_back(guarded_alloc(b.bytes.size()));
            std::memcpy(inl.back().data, b.bytes.data(), b.bytes.size());
            proto.buffer[b.index] = inl.back().data;
        }
        const uint64_t ntg = uint64_t(op.grid[0]) * op.grid[1] * op.grid[2];
        std::atomic<uint64_t> next{0};
        auto work = [&](Group* g) {
            g_group = g;
            if (g->tgmem.size() != op.tglen.size() ||
                [&] {
                    for (size_t i = 0; i < op.tglen.size(); i++)
                        if (g->tgmem[i].n != op.tglen[i]) return true;
                    return false;
                }()) {
                for (auto& t : g->tgmem) guarded_free(t);
                g->tgmem.clear();
                for (auto l : op.tglen) g->tgmem.push_back(guarded_alloc(l));
            }
            for (uint64_t tg; (tg = next.fetch_add(1)) < ntg;) run_threadgroup(*g, op, proto, static_cast<unsigned>(tg));
        };
        const unsigned nw = static_cast<unsigned>(std::min<uint64_t>(nworkers, ntg));
        std::vector<std::thread> ts;
        for (unsigned w = 1; w < nw; w++) ts.emplace_back(work, &groups[w]);
        work(&groups[0]);
        for (auto& t : ts) t.join();
        for (auto& b : inl) guarded_free(b);
    }

    for (auto o : outs) {
        const Guarded& b = bufs[o];
        if (std::fwrite(b.data, 1, b.n, stdout) != b.n) die("writing the response failed");
    }
    if (std::fflush(stdout) != 0) die("writing the response failed");
    return 0;
}
