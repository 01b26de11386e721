// Package cpu is the pure-Go compute backend: the reference for every other
// backend and a real backend for Linux workers without a GPU.
//
// Buffers are host memory pooled by size class, so a worker in steady state
// allocates almost nothing (fresh large allocations cost page faults that
// dwarf the arithmetic). Execute runs the ops between two barriers
// concurrently on all cores, as fixed-size row blocks and feature chunks.
//
// Determinism: every reduction has a fixed order that depends only on the
// shape, never on GOMAXPROCS, on the batch or on the vector unit:
//   - a row sum (sum x^2, sum dy*w*x) keeps 32 lane accumulators, lane l
//     taking elements i with i mod 32 == l of the row's 32-aligned prefix
//     and the tail element i into lane i-n32, combined in one fixed tree
//     (see reduceLanes); the AVX2 assembly keeps the same 32 lanes in four
//     YMM registers and uses separate multiplies and adds (no FMA), and the
//     scalar Go code writes float32(a*b) so no arch fuses it either;
//   - dw is summed per block of rowBlock(dim) consecutive rows in row order,
//     and the block partials are added in block order.
//
// Fusion: when an RMSInv's outputs are read, after the next barrier, only
// by one DX and/or one DW of the same x (and dy), the three passes run as
// one row kernel while the row is in cache. The fused kernel computes r, dx
// and dw with exactly the unfused arithmetic, so the bits are the same
// (tested).
package cpu
