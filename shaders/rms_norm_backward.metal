// rms_norm_backward.metal: the three RMSNorm-backward kernels of rmsgrad.
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
//   so dx[b,k] = r[b] * dy[b,k] * w[k] - x[b,k] * r[b]^3 / D * s[b]
//              = r[b] * (dy[b,k]*w[k] - x[b,k] * s[b] * r[b]^2 / D),
//   where s[b] = sum_i dy[b,i] * x[b,i] * w[i].
// r is computed once (rms_norm_compute_rms_inv_f32) and read by both other
// kernels, so the host puts a memory barrier between the first and the rest.
//
// Launch geometry (threadgroup sizes, grids, threadgroup memory lengths, the
// buffer indices) comes from ONE Go function, shaders.MetalPlan in
// metal_dispatch.go; the Metal backend and the msl-cpu test backend both use
// it. Every kernel assumes threadgroups that are whole simdgroups of 32.
//
// Determinism: every reduction has a fixed order that depends only on the
// launch geometry, which depends only on (rows, dim). Per-thread partials
// are accumulated in index order; simdgroups reduce with a fixed
// shuffle-down tree; simdgroup partials are reduced by the same tree. The
// same job therefore gives the same bits whatever else is in the batch.
//
// Rows and dim come as integers in rms_geom (bound next to the float2
// params) because a dim above 2^24 is not exact in f32; the float params
// still supply eps and the divisor D, as in the seed's layout.
//
// This file is also compiled as C++ by shaders/mslcpu against a shim of the
// MSL subset used here, so keep to: address-space qualifiers, [[...]]
// argument attributes, threadgroup memory passed as [[threadgroup(n)]],
// threadgroup_barrier, simd_shuffle_down, simd_broadcast, fma, sqrt.

#include <metal_stdlib>
using namespace metal;

// Integer geometry of one dispatch, bound with setBytes.
struct rms_geom {
    uint rows;
    uint dim;
    uint pad0;
    uint pad1;
};

// Sum over the 32 lanes of a simdgroup in a fixed tree order
// (lane 0 gets ((v0+v16)+(v8+v24))+...), broadcast to every lane. Every lane
// of the simdgroup must call it (uniform control flow).
static inline float simd_tree_sum(float v) {
    v += simd_shuffle_down(v, 16u);
    v += simd_shuffle_down(v, 8u);
    v += simd_shuffle_down(v, 4u);
    v += simd_shuffle_down(v, 2u);
    v += simd_shuffle_down(v, 1u);
    return simd_broadcast(v, 0u);
}

// Sum over the whole threadgroup in a fixed order: a tree inside each
// simdgroup, then every simdgroup reduces the nsg simdgroup partials with the
// same tree (so all threads get the same value with one barrier less than a
// "first simdgroup only" step). scratch holds nsg floats. Every thread of the
// threadgroup must call it.
static inline float threadgroup_sum(float v, threadgroup float* scratch,
                                    uint lane, uint sg, uint nsg) {
    v = simd_tree_sum(v);
    if (lane == 0) {
        scratch[sg] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float p = lane < nsg ? scratch[lane] : 0.0f;
    p = simd_tree_sum(p);
    // Nobody may overwrite scratch (a later call) before all have read it.
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return p;
}

// r[row] = 1 / sqrt(mean(x[row,:]^2) + eps). One threadgroup per row; each
// thread strides the row (adjacent threads read adjacent floats).
// params = [eps, dim].
kernel void rms_norm_compute_rms_inv_f32(
    device const float*  x        [[buffer(0)]],
    device float*        r        [[buffer(1)]],
    constant float2&     params   [[buffer(2)]],
    constant rms_geom&   geom     [[buffer(3)]],
    threadgroup float*   scratch  [[threadgroup(0)]],
    uint row  [[threadgroup_position_in_grid]],
    uint lid  [[thread_position_in_threadgroup]],
    uint tpg  [[threads_per_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg   [[simdgroup_index_in_threadgroup]],
    uint nsg  [[simdgroups_per_threadgroup]])
{
    const uint dim = geom.dim;
    device const float* xr = x + row * dim; // rows*dim < 2^31: no overflow
    float acc = 0.0f;
    for (uint i = lid; i < dim; i += tpg) {
        acc = fma(xr[i], xr[i], acc);
    }
    const float ss = threadgroup_sum(acc, scratch, lane, sg, nsg);
    if (lid == 0) {
        r[row] = 1.0f / sqrt(ss / params.y + params.x);
    }
}

// dx[row,k] = r * (dy[row,k]*w[k] - x[row,k] * s * r^2 / D). One threadgroup
// per row: a reduction for s, then an elementwise pass over the same row
// (still in cache). params = [dim, 0].
kernel void rms_norm_backward_dx_f32(
    device const float*  x        [[buffer(0)]],
    device const float*  w        [[buffer(1)]],
    device const float*  dy       [[buffer(2)]],
    device const float*  r        [[buffer(3)]],
    device float*        dx       [[buffer(4)]],
    constant float2&     params   [[buffer(5)]],
    constant rms_geom&   geom     [[buffer(6)]],
    threadgroup float*   scratch  [[threadgroup(0)]],
    uint row  [[threadgroup_position_in_grid]],
    uint lid  [[thread_position_in_threadgroup]],
    uint tpg  [[threads_per_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg   [[simdgroup_index_in_threadgroup]],
    uint nsg  [[simdgroups_per_threadgroup]])
{
    const uint dim = geom.dim;
    const uint base = row * dim;
    device const float* xr = x + base;
    device const float* dyr = dy + base;
    device float* dxr = dx + base;
    const float rb = r[row];

    float acc = 0.0f;
    for (uint i = lid; i < dim; i += tpg) {
        acc = fma(dyr[i] * xr[i], w[i], acc);
    }
    const float s = threadgroup_sum(acc, scratch, lane, sg, nsg);
    const float coeff = s * rb * rb / params.x;
    for (uint i = lid; i < dim; i += tpg) {
        dxr[i] = rb * fma(-xr[i], coeff, dyr[i] * w[i]);
    }
}

// dw[f] = sum_b dy[b,f] * x[b,f] * r[b]. Unlike the seed (one threadgroup
// per feature, threads striding down a column: every simd load touches 32
// cache lines) a threadgroup owns a tile of 32 consecutive features: lane =
// feature within the tile, simdgroup = row lane. Each simdgroup reads 32
// consecutive floats (128 bytes, one coalesced load) of rows sg, sg+nsg, ...
// in order; the nsg row-lane partials of each feature are then summed in
// order 0..nsg-1 through threadgroup memory. partial holds nsg*32 floats.
// params = [dim, rows].
kernel void rms_norm_backward_dw_f32(
    device const float*  x        [[buffer(0)]],
    device const float*  dy       [[buffer(1)]],
    device const float*  r        [[buffer(2)]],
    device float*        dw       [[buffer(3)]],
    constant float2&     params   [[buffer(4)]],
    constant rms_geom&   geom     [[buffer(5)]],
    threadgroup float*   partial  [[threadgroup(0)]],
    uint tile [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg   [[simdgroup_index_in_threadgroup]],
    uint nsg  [[simdgroups_per_threadgroup]])
{
    const uint dim = geom.dim;
    const uint rows = geom.rows;
    const uint f = tile * 32u + lane;
    float acc = 0.0f;
    if (f < dim) {
        for (uint b = sg; b < rows; b += nsg) {
            const uint idx = b * dim + f;
            acc = fma(dy[idx] * x[idx], r[b], acc);
        }
    }
    partial[sg * 32u + lane] = acc;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 0 && f < dim) {
        float sum = partial[lane];
        for (uint k = 1; k < nsg; ++k) {
            sum += partial[k * 32u + lane];
        }
        dw[f] = sum;
    }
}
