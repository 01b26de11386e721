// rms_norm_backward.metal: the RMSNorm-backward kernels of rmsgrad's Metal
// backend.
//
// Forward (for reference): y[b,i] = x[b,i] * r[b] * w[i], with
//   r[b] = 1 / sqrt(ms[b] + eps),   ms[b] = (1/D) * sum_i x[b,i]^2.
//
// Backward, given dy = dL/dy:
//   dw[i]   = sum_b dy[b,i] * x[b,i] * r[b]                  (y is linear in w)
//   dx[b,k] = sum_i dy[b,i] * (d y[b,i] / d x[b,k]), with
//     dy[b,i]/dx[b,k] = w[i] * (delta_ik * r[b] + x[b,i] * dr[b]/dx[b,k])
//     dr[b]/dx[b,k]   = -1/2 * (ms[b] + eps)^(-3/2) * 2 x[b,k] / D
//                     = -r[b]^3 * x[b,k] / D
//   so dx[b,k] = r[b] * (dy[b,k]*w[k] - x[b,k] * s[b] * r[b]^2 / D),
//   where s[b] = sum_i dy[b,i] * x[b,i] * w[i].
//   With D = 1 that is r*dy*w*(1 - x^2 r^2), which cancels in float32;
//   1 - x^2 r^2 = eps*r^2 exactly, so there dx = ((dy*w)*((eps*r)*r))*r.
//
// Two kernels, dispatched by shaders.PlanMetal (metal_plan.go), which the
// Metal backend and the msl-cpu test backend both encode:
//
// rms_norm_backward_rows_f32 runs the row-wise work of one job. Its flags
// say what to do: compute r (or read it), write r, write dx, accumulate dw.
// The three ops of package compute (RMSInv, DX, DW) are flag sets of this
// one code path, and an RMSInv fused with its job's DX and DW is the flag
// set with everything on, so fused and unfused give the same bits: the
// same compiled instructions run in the same order either way.
//   A job's rows are split into G row groups (G a function of rows alone);
// threadgroup g owns rows g, g+G, g+2G, ... and keeps its dw sums in
// registers across its rows, so one pass over x and dy gives r, dx and dw
// partials while each row is on chip. Thread t of the T threads owns the
// elements t, t+T, t+2T, ... of every row (adjacent threads read adjacent
// elements). Up to RMS_REG_ELEMS elements per thread the row of x and dy is
// held in registers between the row sums and the dx/dw pass; wider rows are
// read twice (the second read is served by the cache when the row fits).
//
// rms_norm_dw_reduce_f32 sums the G partial rows of dw in a fixed order
// (RMS_RED_SLICES interleaved slices summed in group order, then the slices
// in slice order). With G = 1 the rows kernel writes dw itself.
//
// Memory traffic (the register path, dims up to T*RMS_REG_ELEMS = 8192):
// x and dy are read once and dx written once, 12 bytes per element of f32;
// w is read per row but is one row shared by every threadgroup (cache);
// r adds 4 bytes per row; the partials add G*dim*4 written and read once
// more, and dw dim*4. With rows >= RMS_MIN_GROUP_ROWS*G that is at most
// 12 + 8/16 + 4/rows + 4/dim bytes per element: under 13 at large shapes.
//
// Determinism: every sum has a fixed order that depends only on (rows, dim)
// and the threadgroup size T, which the host picks from dim and the
// device's thread limit (512 on the GPUs rmsgrad targets), never on the rest
// of a batch or on the SIMD width: a thread sums its elements in index
// order, then the T thread partials are summed in one fixed pairwise tree
// (tg_sum2), whose levels inside a SIMD group use simd_shuffle_xor and
// whose levels across SIMD groups go through threadgroup memory; the tree
// is the same for any SIMD width that divides T (8, 16, 32 or 64).
//
// Element types: each of x, w, dy, dx and dw is f32, bf16 or f16 (a code in
// rms_geom); r is always f32. Loads widen to float exactly; stores round
// to nearest even, with bit operations (as MLX does for bf16), so GPUs
// without native bfloat work and every GPU rounds alike. All arithmetic and
// every sum is float32.
//
// This file is also compiled as C++ by shaders/mslcpu against a shim of the
// MSL subset used here, so keep to: address-space qualifiers, [[...]]
// argument attributes, threadgroup memory passed as [[threadgroup(n)]],
// threadgroup_barrier, simd_shuffle_xor, as_type, fma, sqrt.

#include <metal_stdlib>
using namespace metal;

// Flags of the rows kernel (shaders.MetalFlag* in Go).
#define F_COMPUTE_R 1u
#define F_WRITE_R 2u
#define F_DX 4u
#define F_DW 8u
#define F_DW_DIRECT 16u // part is dw itself (one group; see the rows kernel)

// Element type codes (shaders.MetalDType* in Go).
#define T_F32 0u
#define T_BF16 1u
#define T_F16 2u

// Elements per thread held in registers (shaders.MetalRegElems).
#define RMS_REG_ELEMS 16u
// dw reduction geometry (shaders.MetalReduce*): columns per threadgroup and
// interleaved group slices.
#define RMS_RED_COLS 32u
#define RMS_RED_SLICES 8u

// Geometry and parameters of one dispatch, bound with setBytes
// (shaders.metalGeom in Go writes the same 48 bytes).
struct rms_geom {
    uint rows;    // rows of the job
    uint dim;     // elements per row
    uint groups;  // G: row groups of the job
    uint group0;  // first group of this dispatch (a split dispatch covers a range)
    uint flags;   // F_*
    float eps;    // RMSInv's eps (r), DX's eps (dx of dim 1)
    uint xt;      // element types of x, w, dy, dx (rows kernel) ...
    uint wt;
    uint dyt;
    uint dxt;
    uint dwt;     // ... and of dw (reduce kernel, or rows kernel with G = 1)
    uint pad;
};

// ---- element conversions ----

// bf16 and f16 widen to float exactly.
static inline float bf16_to_f32(ushort h) { return as_type<float>(uint(h) << 16); }

static inline float f16_to_f32(ushort h) {
    const uint sign = uint(h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1fu;
    uint m = h & 0x3ffu;
    if (e == 0x1fu) {
        // Inf; a NaN keeps its payload and is quiet, as F16C's VCVTPH2PS
        // and compute/half make it.
        return as_type<float>(sign | 0x7f800000u | (m << 13) | (m != 0u ? 0x400000u : 0u));
    }
    if (e == 0u) {
        if (m == 0u) {
            return as_type<float>(sign); // +-0
        }
        // Subnormal: normalise (exact).
        e = 113u; // 127 - 15 + 1
        while ((m & 0x400u) == 0u) {
            m <<= 1;
            e -= 1u;
        }
        m &= 0x3ffu;
        return as_type<float>(sign | (e << 23) | (m << 13));
    }
    return as_type<float>(sign | ((e + 112u) << 23) | (m << 13));
}

// float to bf16, round to nearest even; NaN stays a (quiet) NaN.
static inline ushort f32_to_bf16(float f) {
    uint u = as_type<uint>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return ushort((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return ushort(u >> 16);
}

// float to f16, round to nearest even; overflow to Inf, NaN stays a (quiet)
// NaN, results below the normal range become subnormals or zero.
static inline ushort f32_to_f16(float f) {
    const uint u = as_type<uint>(f);
    const uint sign = (u >> 16) & 0x8000u;
    const uint a = u & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return ushort(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    }
    if (a >= 0x477ff000u) {
        return ushort(sign | 0x7c00u); // rounds to >= 65520: Inf
    }
    if (a >= 0x38800000u) { // normal f16 (>= 2^-14)
        const uint r = a + 0xfffu + ((a >> 13) & 1u);
        return ushort(sign | ((r - 0x38000000u) >> 13));
    }
    if (a < 0x33000000u) {
        return ushort(sign); // below half the smallest subnormal (2^-25): zero
    }
    // Subnormal f16: shift the 24-bit significand into place, RNE.
    const uint e = a >> 23;
    const uint m = (a & 0x7fffffu) | 0x800000u;
    const uint shift = 126u - e; // 14..24
    const uint half_ulp = 1u << (shift - 1u);
    const uint rest = m & ((1u << shift) - 1u);
    uint q = m >> shift;
    if (rest > half_ulp || (rest == half_ulp && (q & 1u) != 0u)) {
        q += 1u;
    }
    return ushort(sign | q);
}

static inline float load_elem(device const uchar* p, uint i, uint t) {
    if (t == T_F32) {
        return ((device const float*)p)[i];
    }
    const ushort h = ((device const ushort*)p)[i];
    return t == T_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static inline void store_elem(device uchar* p, uint i, uint t, float v) {
    if (t == T_F32) {
        ((device float*)p)[i] = v;
    } else {
        ((device ushort*)p)[i] = t == T_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
    }
}

// ---- the threadgroup sum ----

// tg_sum2 sums a and b over the T threads of the threadgroup and returns the
// totals to every thread. The order is one fixed pairwise tree over the
// thread index (pairs 2i, 2i+1 first, then pairs of pairs, ...), whatever
// the SIMD width W (a power of two dividing T): the levels inside a SIMD
// group are xor butterflies (offsets 1, 2, ..., W/2; a+b and b+a are the
// same bits, so every lane holds its aligned block's sum), the levels above
// go through threadgroup memory in rounds of up to W partials, each summed
// with the same butterfly. red holds T floats: two halves by row parity p
// (so one barrier per round suffices from row to row), each with room for
// the rounds' (a, b) pairs, T/W + T/W^2 + ... < T/4 of them for W >= 8. Every
// thread of the threadgroup must call it (uniform control flow).
static inline void tg_sum2(thread float& a, thread float& b, threadgroup float* red, uint T,
                           uint W, uint lane, uint sg, uint p) {
    for (uint o = 1u; o < W; o <<= 1) {
        a += simd_shuffle_xor(a, ushort(o));
        b += simd_shuffle_xor(b, ushort(o));
    }
    threadgroup float* buf = red + p * (T / 2u);
    uint n = T / W;                              // partials: one per SIMD group
    while (n > 1u) {
        if (lane == 0u && sg < n) {
            buf[2u * sg] = a;
            buf[2u * sg + 1u] = b;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // Round: SIMD group g sums partials g*m .. g*m+m-1. In the last
        // round (n <= W) every aligned block of m lanes of every SIMD group
        // sums them all, in the same order, so every thread gets the totals.
        const uint m = min(n, W);
        const uint idx = n <= W ? lane % m : sg * m + lane;
        const bool have = idx < n;
        a = have ? buf[2u * idx] : 0.0f;
        b = have ? buf[2u * idx + 1u] : 0.0f;
        for (uint o = 1u; o < m; o <<= 1) {
            a += simd_shuffle_xor(a, ushort(o));
            b += simd_shuffle_xor(b, ushort(o));
        }
        buf += 2u * n; // the next round's partials go after this round's
        n /= m;
    }
}

// dx of one element: r*(dy*w - x*c), or the exact dim-1 form.
static inline float dx_elem(float xv, float dv, float wv, float rb, float c, uint dim, float eps) {
    if (dim == 1u) {
        return ((dv * wv) * ((eps * rb) * rb)) * rb;
    }
    return rb * fma(-xv, c, dv * wv);
}

// The rows of one row group. One threadgroup per group of the dispatch's
// range [group0, group0 + threadgroups). Buffers a flag set does not use
// are bound to a placeholder of zero useful bytes and never touched.
// part holds the groups' dw partial rows ([G, dim] f32), or is dw itself
// (type dwt) with F_DW_DIRECT. red holds T floats (see tg_sum2).
kernel void rms_norm_backward_rows_f32(
    device const uchar*  x        [[buffer(0)]],
    device const uchar*  w        [[buffer(1)]],
    device const uchar*  dy       [[buffer(2)]],
    device float*        r        [[buffer(3)]],
    device uchar*        dx       [[buffer(4)]],
    device uchar*        part     [[buffer(5)]],
    constant rms_geom&   geom     [[buffer(6)]],
    threadgroup float*   red      [[threadgroup(0)]],
    uint tg   [[threadgroup_position_in_grid]],
    uint t    [[thread_position_in_threadgroup]],
    uint T    [[threads_per_threadgroup]],
    uint W    [[threads_per_simdgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg   [[simdgroup_index_in_threadgroup]])
{
    const uint rows = geom.rows, dim = geom.dim, G = geom.groups;
    const uint grp = geom.group0 + tg;
    const bool doR = (geom.flags & F_COMPUTE_R) != 0u;
    const bool writeR = (geom.flags & F_WRITE_R) != 0u;
    const bool doDX = (geom.flags & F_DX) != 0u;
    const bool doDW = (geom.flags & F_DW) != 0u;
    const bool needDY = doDX || doDW;
    const bool sums = doR || doDX;
    const uint xt = geom.xt, wt = geom.wt, dyt = geom.dyt, dxt = geom.dxt;
    const float eps = geom.eps;
    // Partials are f32 rows [G, dim] of a scratch buffer. With one group
    // the host binds dw itself instead (F_DW_DIRECT) when that rounds once:
    // dw is f32, or the sums stay in registers until the end.
    const bool direct = (geom.flags & F_DW_DIRECT) != 0u;
    const uint pt = direct ? geom.dwt : T_F32;
    const uint pbase = direct ? 0u : grp * dim;
    const uint E = (dim + T - 1u) / T; // elements per thread
    const bool regs = E <= RMS_REG_ELEMS;

    float dwacc[RMS_REG_ELEMS];
    for (uint k = 0u; k < RMS_REG_ELEMS; ++k) {
        dwacc[k] = 0.0f;
    }
    uint p = 0u;
    for (uint row = grp, b = 0u; row < rows; row += G, ++b) {
        const uint base = row * dim; // rows*dim < 2^31: no overflow
        float ss = 0.0f, s = 0.0f;
        float xs[RMS_REG_ELEMS], ds[RMS_REG_ELEMS];
        if (regs) {
            for (uint k = 0u; k < RMS_REG_ELEMS; ++k) {
                const uint i = t + k * T;
                const bool in = k < E && i < dim;
                xs[k] = in ? load_elem(x, base + i, xt) : 0.0f;
                ds[k] = in && needDY ? load_elem(dy, base + i, dyt) : 0.0f;
            }
            if (sums) {
                for (uint k = 0u; k < RMS_REG_ELEMS; ++k) {
                    const uint i = t + k * T;
                    if (k < E && i < dim) {
                        if (doR) {
                            ss = fma(xs[k], xs[k], ss);
                        }
                        if (doDX) {
                            s = fma(ds[k] * xs[k], load_elem(w, i, wt), s);
                        }
                    }
                }
            }
        } else if (sums) {
            for (uint i = t; i < dim; i += T) {
                const float xv = load_elem(x, base + i, xt);
                if (doR) {
                    ss = fma(xv, xv, ss);
                }
                if (doDX) {
                    s = fma(load_elem(dy, base + i, dyt) * xv, load_elem(w, i, wt), s);
                }
            }
        }
        if (sums) {
            tg_sum2(ss, s, red, T, W, lane, sg, p);
            p ^= 1u;
        }
        float rb;
        if (doR) {
            rb = 1.0f / sqrt(ss / float(dim) + eps);
            if (writeR && t == 0u) {
                r[row] = rb;
            }
        } else {
            rb = r[row];
        }
        if (!needDY) {
            continue;
        }
        const float c = s * rb * rb / float(dim);
        if (regs) {
            for (uint k = 0u; k < RMS_REG_ELEMS; ++k) {
                const uint i = t + k * T;
                if (k < E && i < dim) {
                    if (doDX) {
                        store_elem(dx, base + i, dxt, dx_elem(xs[k], ds[k], load_elem(w, i, wt), rb, c, dim, eps));
                    }
                    if (doDW) {
                        dwacc[k] = fma(ds[k] * xs[k], rb, dwacc[k]);
                    }
                }
            }
        } else {
            for (uint i = t; i < dim; i += T) {
                const float xv = load_elem(x, base + i, xt);
                const float dv = load_elem(dy, base + i, dyt);
                if (doDX) {
                    store_elem(dx, base + i, dxt, dx_elem(xv, dv, load_elem(w, i, wt), rb, c, dim, eps));
                }
                if (doDW) {
                    // The group's running sum lives in its partial row:
                    // only this thread touches these elements of it.
                    const float a = b == 0u ? 0.0f : load_elem(part, pbase + i, pt);
                    store_elem(part, pbase + i, pt, fma(dv * xv, rb, a));
                }
            }
        }
    }
    if (doDW && regs) {
        for (uint k = 0u; k < RMS_REG_ELEMS; ++k) {
            const uint i = t + k * T;
            if (k < E && i < dim) {
                store_elem(part, pbase + i, pt, dwacc[k]);
            }
        }
    }
}

// dw[i] = sum over the G groups of part[g, i]: threadgroup tile owns
// RMS_RED_COLS consecutive columns; thread (slice sl, column c) sums groups
// sl, sl+RMS_RED_SLICES, ... in order, then slice 0 adds the slices' sums
// in slice order. red holds RMS_RED_SLICES*RMS_RED_COLS floats. 256
// threads.
kernel void rms_norm_dw_reduce_f32(
    device const float*  part     [[buffer(0)]],
    device uchar*        dw       [[buffer(1)]],
    constant rms_geom&   geom     [[buffer(2)]],
    threadgroup float*   red      [[threadgroup(0)]],
    uint tile [[threadgroup_position_in_grid]],
    uint t    [[thread_position_in_threadgroup]])
{
    const uint dim = geom.dim, G = geom.groups;
    const uint col = t % RMS_RED_COLS, sl = t / RMS_RED_COLS;
    const uint i = tile * RMS_RED_COLS + col;
    float a = 0.0f;
    if (i < dim) {
        for (uint g = sl; g < G; g += RMS_RED_SLICES) {
            a += part[g * dim + i];
        }
    }
    red[sl * RMS_RED_COLS + col] = a;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sl == 0u && i < dim) {
        float sum = red[col];
        for (uint k = 1u; k < RMS_RED_SLICES; ++k) {
            sum += red[k * RMS_RED_COLS + col];
        }
        store_elem(dw, i, geom.dwt, sum);
    }
}
