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
// Dtypes: x, w, dy, dx and dw may each be F32, BF16 or F16. A row of a
// half input is widened into float32 scratch as it is read (exact), w once
// per Execute; dx rows are computed in float32 and rounded to their dtype
// as they are stored, dw is summed in float32 partials and rounded by the
// reduction. The arithmetic is the F32 arithmetic above, unchanged, so a
// half output is bit for bit the F32 output rounded once. The conversions
// use the machine's instructions where it has them, picked at run time with
// golang.org/x/sys/cpu: BF16 -> F32 with AVX2 (VPMOVZXWD, VPSLLD: a shift);
// F16 <-> F32 with F16C (VCVTPH2PS; VCVTPS2PH with immediate 0, round to
// nearest even); F32 -> BF16 with AVX-512 BF16 (VCVTNEPS2BF16, whose NaN
// bits are compute/half's; it flushes subnormal inputs to zero, so those
// lanes are redone with integer rounding) or, without it, AVX2 integer
// rounding. The Go code (compute/half) is the portable path and gives the
// same bits (tested on every half pattern and fuzzed); DeviceName names
// what runs, e.g. "avx2+f16c+avx512bf16".
//
// Fusion: when an RMSInv's outputs are read, after the next barrier, only
// by one DX and/or one DW of the same x (and dy), the three passes run as
// one row kernel while the row is in cache. The fused kernel computes r, dx
// and dw with exactly the unfused arithmetic, so the bits are the same
// (tested).
package cpu
