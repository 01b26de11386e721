// RMSNorm backward for the cuda backend, compiled by NVRTC at start-up for the
// device's architecture (cuda/backend.go). Self-contained: NVRTC sees no host
// headers.
//
// x is [rows, dim], w is [dim], dy is [rows, dim]:
//   r[b]    = 1 / sqrt(mean_i(x[b,i]^2) + eps)
//   s[b]    = sum_i dy[b,i] * x[b,i] * w[i]
//   dx[b,k] = r[b] * (dy[b,k]*w[k] - x[b,k] * (s[b] * r[b]^2 / dim))
//   dw[i]   = sum_b dy[b,i] * x[b,i] * r[b]
//
// The rows kernels run every row-wise piece of work of one phase of a batch
// over a job table (one launch for many jobs: per-launch cost is what
// decides small-job throughput). A block map gives each block its job; the
// block then owns a group of that job's rows, every G-th row from its group
// index (persistent blocks: a large job gets as many groups as fit on the
// multiprocessors at once, and the groups sweep the tensor side by side; a
// small job gets one, which stores dw itself). Each job entry says what to
// do with flags: compute r (or read it), write r, write dx, write dw. The
// three kernels of compute (rms_norm_compute_rms_inv_f32,
// rms_norm_backward_dx_f32, rms_norm_backward_dw_f32) are flag sets of the
// general kernel, rms_norm_backward_rows_f32; the common case (all three in
// one pass) runs in the fused kernels of the register path's width classes.
// A job whose RMSInv, DX and DW the backend fuses into one pass gives the
// same bits as the three run apart: the arithmetic is the same
// instructions in the same order. Every float operation uses an explicit
// round-to-nearest intrinsic so the compiler cannot contract or reorder
// differently between variants.
//
// Determinism: the reduction order of a row depends only on dim and x's
// dtype (the host picks the block size T and the chunk width CW from them
// alone: CW is 4 elements for F32 x, 8 for BF16 and F16 x; thread t owns
// chunks t, t+T, ...; each thread sums its chunks' elements in order, then
// a fixed xor-butterfly per warp, then a butterfly over the warp sums). dw partials
// are per row group ([G, dim], the group count a function of rows, dim and
// the device only, rows inside a group summed in order) and
// rms_norm_dw_reduce_f32 adds the G partials of each column in a fixed tree
// (32 strided slices summed in order, then the slices in order). No float
// atomics anywhere, so dx and dw are bitwise identical across runs, batch
// compositions and recording orders.
//
// Dtypes: x, w, dy, dx and dw are each F32, BF16 or F16 (the job entry's
// types word); r and the dw partials are F32 and all arithmetic is float32
// in the same order whatever the dtypes. A half input element is widened
// exactly as it is loaded (chunks of 8 halfs: one 16-byte load, as a
// float4 load is for a chunk of 4 floats), and a half output
// is the float32 result rounded once to nearest even as it is stored
// (bf16: integer rounding, with the NaN rule of compute/half; f16: PTX
// cvt.rn.f16.f32, NaN as compute/half). The rows code is compiled for the
// job's IO type, the dtype x, dy and dx share (F32, BF16 or F16, so the
// loads and stores of the bandwidth-bound tensors are typed at compile
// time), or T_ANY, where each of them reads its own dtype from the entry
// (mixes such as x in F16 and dy in BF16). w is loaded once per row group
// on the register paths and dw stored once per column, so both read their
// dtype at run time.

// Block size of the reduction and of the shared-memory path; the block
// size of the general path for dims that are not a multiple of 4 or are
// over 8192.
#define RMS_THREADS 256
// Chunks (of 4 floats) per thread of the shared-memory path (rows_smem,
// dim <= 256*4*8 = 8192, a multiple of 4; taken only when the host is asked
// to, RMSGRAD_CUDA_STAGES). The register paths (rows_regs) hold up to 4
// chunks per thread; beyond, the same arithmetic re-reads from global
// memory (rows_stream).
#define RMS_KMAX 8

// The host compiles the file as several programs at once (cuda/backend.go
// kernelParts), RMS_PART=n keeping the kernels of part n: 0 the general
// rows kernel, 1 the reduction and the benchmark kernels, 2+c fused class
// c (c0..c12; the BF16 kernel of a half class), 15..20 the F16 kernels of
// the half classes c7..c12. Without RMS_PART (the CPU test harness, nvcc)
// every kernel is kept.
#ifdef RMS_PART
#define RMS_PART_IS(n) (RMS_PART == (n))
#else
#define RMS_PART_IS(n) 1
#endif

#define F_COMPUTE_R 1
#define F_WRITE_R 2
#define F_DX 4
#define F_DW 8
#define F_ALL (F_COMPUTE_R | F_WRITE_R | F_DX | F_DW)

// Element types, 2 bits each in Job.types; cuda/plan.go uses the same codes.
#define T_F32 0
#define T_BF16 1
#define T_F16 2
#define T_ANY 3 // IO only: x, dy and dx do not share one dtype
#define TYPE_X(J) ((J).types & 3)
#define TYPE_W(J) (((J).types >> 2) & 3)
#define TYPE_DY(J) (((J).types >> 4) & 3)
#define TYPE_DX(J) (((J).types >> 6) & 3)
#define TYPE_DW(J) (((J).types >> 8) & 3)
#define TYPE_IO(J) (((J).types >> 10) & 3)

// Job is one entry of the job table; cuda/plan.go writes the same layout
// (jobEntry, 96 bytes).
struct Job {
	const void* x;
	const void* w;
	const void* dy;
	float* r;
	void* dx;
	float* part; // [g, dim] dw partials
	void* dw;
	int rows;
	int dim;
	int rg;     // rows per group
	int g;      // groups = ceil(rows / rg) = blocks of the rows kernel
	int flags;
	float eps;
	int start;  // first block of this job in the rows launch
	int rstart; // first block of this job in the reduce launch
	int stages; // shared-memory row slots (rows_smem); 0: registers path
	int types;  // dtypes of x, w, dy, dx, dw and the IO type (TYPE_*)
};

// RMS_GLOBAL_STORES (a benchmark variant, RMSGRAD_CUDA_NVRTC_OPTS) issues
// the vector stores of dx, dw and the dw partials as st.global. The kernels
// read their tensors' pointers from the job table with non-coherent loads,
// after which the compiler cannot tell that they point to global memory:
// it emits generic stores (ST in the SASS), where a kernel that takes its
// pointers as parameters gets global ones (STG). No kernel reads back
// what it stored, so the asm needs no memory clobber.
// The default is the plain stores, written as macros so that the code is
// the same as without them (an inline function taking the value made NVRTC
// 11.8 spill 16 bytes in c8).
#if defined(RMS_GLOBAL_STORES) && !defined(RMS_EMU)
__device__ __forceinline__ void stg_f4(float* p, float4 v) {
	asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w));
}
__device__ __forceinline__ void stg_u2(unsigned short* p, uint2 v) {
	asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y));
}
__device__ __forceinline__ void stg_u4(unsigned short* p, uint4 v) {
	asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
#define ST_F4(p, v) stg_f4((p), (v))
#define ST_U2(p, v) stg_u2((p), (v))
#define ST_U4(p, v) stg_u4((p), (v))
#else
#define ST_F4(p, v) (*reinterpret_cast<float4*>(p) = (v))
#define ST_U2(p, v) (*reinterpret_cast<uint2*>(p) = (v))
#define ST_U4(p, v) (*reinterpret_cast<uint4*>(p) = (v))
#endif

// RMS_VOLATILE_LOADS (a benchmark variant, RMSGRAD_CUDA_NVRTC_OPTS) issues
// the 16- and 8-byte input loads as volatile asm, so that the compiler
// keeps them where the code puts them (a row's loads S-1 rows ahead).
__device__ __forceinline__ void load4(const float* __restrict__ p, int e, int dim, bool vec, float v[4]) {
	if (vec) {
#if defined(RMS_VOLATILE_LOADS) && !defined(RMS_EMU)
		asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(p + e));
#else
		float4 t = __ldg(reinterpret_cast<const float4*>(p + e));
		v[0] = t.x;
		v[1] = t.y;
		v[2] = t.z;
		v[3] = t.w;
#endif
	} else {
#pragma unroll
		for (int q = 0; q < 4; q++) v[q] = (e + q < dim) ? __ldg(p + e + q) : 0.0f;
	}
}

// Plain (non-__ldg) load for memory this launch writes (dw partials).
__device__ __forceinline__ void load4rw(const float* p, int e, int dim, bool vec, float v[4]) {
	if (vec) {
		float4 t = *reinterpret_cast<const float4*>(p + e);
		v[0] = t.x;
		v[1] = t.y;
		v[2] = t.z;
		v[3] = t.w;
	} else {
#pragma unroll
		for (int q = 0; q < 4; q++) v[q] = (e + q < dim) ? p[e + q] : 0.0f;
	}
}

__device__ __forceinline__ void store4(float* p, int e, int dim, bool vec, const float v[4]) {
	if (vec) {
		ST_F4(p + e, make_float4(v[0], v[1], v[2], v[3]));
	} else {
#pragma unroll
		for (int q = 0; q < 4; q++)
			if (e + q < dim) p[e + q] = v[q];
	}
}

// Half <-> float32. Widening is exact; narrowing rounds to nearest even
// and keeps a NaN a NaN (top mantissa bits kept, quiet bit set), as
// compute/half does. RMS_EMU (the CPU test harness) does the f16 ones in
// integer code; on the device they are one PTX cvt each, NaN handled apart.
__device__ __forceinline__ float bf2f(unsigned int h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ unsigned short f2bf(float f) {
	const unsigned int u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
	return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#ifdef RMS_EMU
__device__ __forceinline__ float h2f(unsigned int h) {
	const unsigned int s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
	if (e == 0x1f) return __uint_as_float(s | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u));
	if (e == 0) {
		const float v = (float)m * (1.0f / 16777216.0f);
		return s ? -v : v;
	}
	return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}
__device__ __forceinline__ unsigned short f2h(float f) {
	const unsigned int b = __float_as_uint(f);
	const unsigned short sign = (unsigned short)((b >> 16) & 0x8000u);
	const int exp = (int)((b >> 23) & 0xffu);
	const unsigned int mant = b & 0x7fffffu;
	if (exp == 0xff) return mant ? (unsigned short)(sign | 0x7e00u | (mant >> 13)) : (unsigned short)(sign | 0x7c00u);
	if (exp == 0) return sign;
	const int e16 = exp - 127 + 15;
	if (e16 >= 0x1f) return (unsigned short)(sign | 0x7c00u);
	const int sh = e16 <= 0 ? 14 - e16 : 13;
	if (sh >= 25) return sign;
	const unsigned int m = mant | 0x800000u, half = 1u << (sh - 1);
	unsigned int r = m >> sh;
	const unsigned int rem = m & ((1u << sh) - 1u);
	if (rem > half || (rem == half && (r & 1u))) r++;
	if (e16 <= 0) return (unsigned short)(sign | r);
	return (unsigned short)(sign + ((unsigned int)(e16 - 1) << 10) + r);
}
#else
__device__ __forceinline__ float h2f(unsigned int h) {
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
	return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
	const unsigned int b = __float_as_uint(f);
	if ((b & 0x7fffffffu) > 0x7f800000u)
		return (unsigned short)(((b >> 16) & 0x8000u) | 0x7e00u | ((b & 0x7fffffu) >> 13));
	unsigned short h;
	asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
	return h;
}
#endif

// tsize is the element size of a dtype; at offsets a tensor by i elements.
__device__ __forceinline__ int tsize(int dt) { return dt == T_F32 ? 4 : 2; }
__device__ __forceinline__ const void* at(const void* p, size_t i, int dt) {
	return (const char*)p + i * (size_t)tsize(dt);
}
__device__ __forceinline__ void* at(void* p, size_t i, int dt) { return (char*)p + i * (size_t)tsize(dt); }

template <int T>
__device__ __forceinline__ float widen(unsigned int h) {
	if constexpr (T == T_BF16) return bf2f(h);
	else return h2f(h);
}
template <int T>
__device__ __forceinline__ unsigned int narrow(float f) {
	if constexpr (T == T_BF16) return f2bf(f);
	else return f2h(f);
}

// narrow2 rounds two float32 to dtype T, packed lo | hi << 16: one PTX cvt
// for both (sm_80+; round to nearest even, no flush, as the scalar forms)
// unless one is a NaN, which takes the scalar forms' NaN rule. On the
// H200, BF16 rows were bound by integer instructions (docs/cuda.md).
template <int T>
__device__ __forceinline__ unsigned int narrow2(float lo, float hi) {
#if !defined(RMS_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
	if (lo == lo && hi == hi) {
		unsigned int d;
		if constexpr (T == T_BF16)
			asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
		else
			asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
		return d;
	}
#endif
	return narrow<T>(lo) | (narrow<T>(hi) << 16);
}

// narrow8 rounds eight float32 (a 16-byte chunk of half dx) to dtype T,
// packed as narrow2 packs pairs, with the same bits: with RMS_NARROW8 set
// (a benchmark variant, RMSGRAD_CUDA_NVRTC_OPTS) one NaN test covers the
// eight and, when none is a NaN, four cvts round them with no branch;
// otherwise (and by default) narrow2 tests each pair.
#ifndef RMS_NARROW8
#define RMS_NARROW8 0
#endif
template <int T>
__device__ __forceinline__ uint4 narrow8(const float (&o)[2][4]) {
#if RMS_NARROW8 && !defined(RMS_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
	bool num = true;
#pragma unroll
	for (int h = 0; h < 2; h++)
#pragma unroll
		for (int i = 0; i < 4; i++) num &= o[h][i] == o[h][i];
	if (num) {
		unsigned int d[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			if constexpr (T == T_BF16)
				asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d[i]) : "f"(o[i >> 1][2 * (i & 1) + 1]), "f"(o[i >> 1][2 * (i & 1)]));
			else
				asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d[i]) : "f"(o[i >> 1][2 * (i & 1) + 1]), "f"(o[i >> 1][2 * (i & 1)]));
		}
		return make_uint4(d[0], d[1], d[2], d[3]);
	}
#endif
	return make_uint4(narrow2<T>(o[0][0], o[0][1]), narrow2<T>(o[0][2], o[0][3]), narrow2<T>(o[1][0], o[1][1]), narrow2<T>(o[1][2], o[1][3]));
}

// loadT loads 4 elements at e of a row p of dtype T (of dt when T is
// T_ANY, which dispatches at run time), widened to float32; past dim, 0.
// A vec chunk of halfs is one 8-byte load.
template <int T>
__device__ __forceinline__ void loadT(const void* p, int e, int dim, bool vec, float v[4], int dt) {
	if constexpr (T == T_ANY) {
		if (dt == T_BF16) loadT<T_BF16>(p, e, dim, vec, v, dt);
		else if (dt == T_F16) loadT<T_F16>(p, e, dim, vec, v, dt);
		else loadT<T_F32>(p, e, dim, vec, v, dt);
	} else if constexpr (T == T_F32) {
		load4((const float*)p, e, dim, vec, v);
	} else {
		const unsigned short* h = (const unsigned short*)p;
		if (vec) {
			const uint2 t = __ldg(reinterpret_cast<const uint2*>(h + e));
			v[0] = widen<T>(t.x & 0xffffu);
			v[1] = widen<T>(t.x >> 16);
			v[2] = widen<T>(t.y & 0xffffu);
			v[3] = widen<T>(t.y >> 16);
		} else {
#pragma unroll
			for (int q = 0; q < 4; q++) v[q] = (e + q < dim) ? widen<T>(__ldg(h + e + q)) : 0.0f;
		}
	}
}

// storeT stores 4 float32 results at e of a row p of dtype T (dt for
// T_ANY), each rounded once to the dtype; nothing past dim.
template <int T>
__device__ __forceinline__ void storeT(void* p, int e, int dim, bool vec, const float v[4], int dt) {
	if constexpr (T == T_ANY) {
		if (dt == T_BF16) storeT<T_BF16>(p, e, dim, vec, v, dt);
		else if (dt == T_F16) storeT<T_F16>(p, e, dim, vec, v, dt);
		else storeT<T_F32>(p, e, dim, vec, v, dt);
	} else if constexpr (T == T_F32) {
		store4((float*)p, e, dim, vec, v);
	} else {
		unsigned short* h = (unsigned short*)p;
		if (vec) {
			ST_U2(h + e, make_uint2(narrow2<T>(v[0], v[1]), narrow2<T>(v[2], v[3])));
		} else {
#pragma unroll
			for (int q = 0; q < 4; q++)
				if (e + q < dim) h[e + q] = (unsigned short)narrow<T>(v[q]);
		}
	}
}

// 16-byte asynchronous copies global -> shared (sm_80+), each thread
// copying, waiting for and reading only its own chunks, so no barrier is
// needed between the copy and the read. Under RMS_EMU the CPU test harness
// (cuda/testdata/kernel_emu.cpp) defines them: copies that land when
// issued or only when waited for.
#ifndef RMS_EMU
extern __shared__ float4 rms_dyn[];
__device__ __forceinline__ void cp_async16(float* s, const float* g) {
	unsigned a;
	asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(s));
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most n of this thread's groups are pending (n in 0..3).
__device__ __forceinline__ void cp_async_wait(int n) {
	switch (n) {
	case 0:
		asm volatile("cp.async.wait_group 0;" ::: "memory");
		break;
	case 1:
		asm volatile("cp.async.wait_group 1;" ::: "memory");
		break;
	case 2:
		asm volatile("cp.async.wait_group 2;" ::: "memory");
		break;
	default:
		asm volatile("cp.async.wait_group 3;" ::: "memory");
	}
}
#endif

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

// Accumulates one chunk's contributions to ss (sum x^2) and s (sum dy*x*w).
// vec (dim % 4 == 0) means every element of a chunk is in the row.
__device__ __forceinline__ void accum(const float xv[4], const float dv[4], const float wv[4], int e,
                                      int dim, bool vec, bool doR, bool doS, float& ss, float& s) {
#pragma unroll
	for (int q = 0; q < 4; q++) {
		if (vec || e + q < dim) {
			if (doR) ss = __fmaf_rn(xv[q], xv[q], ss);
			if (doS) s = __fmaf_rn(__fmul_rn(dv[q], xv[q]), wv[q], s);
		}
	}
}

__device__ __forceinline__ void dx4(const float xv[4], const float dv[4], const float wv[4], float r,
                                    float c, float out[4]) {
#pragma unroll
	for (int q = 0; q < 4; q++) out[q] = __fmul_rn(r, __fmaf_rn(-xv[q], c, __fmul_rn(dv[q], wv[q])));
}

// dx of a row of dim 1: ((dy*w) * ((eps*r)*r)) * r, compute.DXDim1's
// operations in its order. The general form r*(dy*w - x*c) is
// r*dy*w*(1 - x^2 r^2) there, which cancels in float32; 1 - x^2 r^2 is
// exactly eps*r^2.
__device__ __forceinline__ float dx_dim1(float d, float w, float r, float eps) {
	return __fmul_rn(__fmul_rn(__fmul_rn(d, w), __fmul_rn(__fmul_rn(eps, r), r)), r);
}

// Sums (ss[q], s[q]) of R rows over the block's threads (blockDim.x, a
// multiple of 32) in a fixed order: a butterfly in each warp, the warp sums
// through shared memory, then a butterfly over the W = blockDim.x/32 warp
// sums (lanes past them add 0). Every lane of every warp ends with the same
// bits (a xor butterfly pairs the same values in every lane, and float
// addition is commutative). The R rows share one barrier; each row's sum is
// the same tree whatever R, so R changes the schedule and not the bits
// (measured on the H200, docs/cuda.md: two rows a barrier took the
// one-block-per-SM classes from 83-87% to 89-94% of the device copy). red
// ([2][2R][32]) is double-buffered by the parity p of the barrier's count,
// so one barrier per R rows suffices. The order depends on the block size only.
#define RMS_RMAX 4
template <int R>
__device__ __forceinline__ void block_sum(float ss[R], float s[R], float* red, int p) {
	const int W = blockDim.x >> 5;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	float* rp = red + p * (2 * R * 32); // red is [2][2R][32]
#pragma unroll
	for (int q = 0; q < R; q++) {
		ss[q] = warp_sum(ss[q]);
		s[q] = warp_sum(s[q]);
		if (lane == 0) {
			rp[(2 * q) * 32 + warp] = ss[q];
			rp[(2 * q + 1) * 32 + warp] = s[q];
		}
	}
	__syncthreads();
#pragma unroll
	for (int q = 0; q < R; q++) {
		ss[q] = warp_sum(lane < W ? rp[(2 * q) * 32 + lane] : 0.0f);
		s[q] = warp_sum(lane < W ? rp[(2 * q + 1) * 32 + lane] : 0.0f);
	}
}

// block_sum2 is block_sum of one row (red: [2][2][32]).
__device__ __forceinline__ void block_sum2(float& ss, float& s, float* red, int p) {
	float a[1] = {ss}, b[1] = {s};
	block_sum<1>(a, b, red, p);
	ss = a[0];
	s = b[0];
}

__device__ __forceinline__ float rms_inv(float ss, int dim, float eps) {
	return __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), eps)));
}

// Group grp of a job takes rows grp, grp+G, grp+2G, ... (G = J.g groups):
// the blocks of a launch sweep the tensor side by side, as a copy does,
// which measured 5-6 points of copy bandwidth over contiguous runs of rows
// per block at 16384x4096 on the H200 (docs/cuda.md, run 9). The order of a
// group's rows is fixed, so its dw partial's summation order is too.
__device__ __forceinline__ int group_rows(const Job& J, int grp) { return (J.rows - grp + J.g - 1) / J.g; }
#define rowOf(b) ((size_t)grp + (size_t)(b) * (size_t)G)

// store_dw ends a group's dw sums a (4 columns from element e). A job in one
// group (J.g == 1: the small jobs) stores dw itself, as a + 0 in dw's
// dtype: the bits the reduction gives for a single partial (it adds the
// partial to 0), with no partials and no reduce launch. Otherwise the sums
// are the group's partial row, for rms_norm_dw_reduce_f32.
__device__ __forceinline__ void store_dw(const Job& J, int grp, int e, int dim, bool vec, const float a[4]) {
	if (J.g == 1) {
		float o[4];
#pragma unroll
		for (int q = 0; q < 4; q++) o[q] = __fadd_rn(a[q], 0.0f);
		storeT<T_ANY>(J.dw, e, dim, vec, o, TYPE_DW(J));
	} else {
#ifdef RMS_PART_SKIP
		// A probe (docs/cuda.md): the partials are not stored (the dw
		// reduce then sums stale scratch), but the stores stay behind a
		// test the compiler cannot fold, so the sums are still made.
		if (a[0] != 1.5e-39f) return;
#endif
		store4(J.part + (size_t)grp * dim, e, dim, vec, a);
	}
}

// Chunk<IO> is a piece of 4 elements of a row (a chunk of rows_regs is one
// or two pieces) as the register path holds them between their load and
// their use: F32 (and T_ANY, widened as loaded) as 4 floats, BF16 and F16
// as loaded, two to a 32-bit word, widened when used, so a row of halfs
// takes half the registers and twice the rows fit in flight. Elements past
// dim are 0.
template <int IO>
struct Chunk {
	float f[4];
	__device__ __forceinline__ void clear() { f[0] = f[1] = f[2] = f[3] = 0.0f; }
	__device__ __forceinline__ void load(const void* p, int e, int dim, bool vec, int dt) { loadT<IO>(p, e, dim, vec, f, dt); }
	__device__ __forceinline__ void get(float v[4]) const {
#pragma unroll
		for (int q = 0; q < 4; q++) v[q] = f[q];
	}
};
template <int H>
struct HalfChunk {
	unsigned int h[2];
	__device__ __forceinline__ void clear() { h[0] = h[1] = 0u; }
	__device__ __forceinline__ void load(const void* p, int e, int dim, bool vec, int) {
		const unsigned short* u = (const unsigned short*)p;
		if (vec) {
#if defined(RMS_VOLATILE_LOADS) && !defined(RMS_EMU)
			asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(h[0]), "=r"(h[1]) : "l"(u + e));
#else
			const uint2 t = __ldg(reinterpret_cast<const uint2*>(u + e));
			h[0] = t.x;
			h[1] = t.y;
#endif
		} else {
			unsigned int q[4];
#pragma unroll
			for (int i = 0; i < 4; i++) q[i] = (e + i < dim) ? (unsigned int)__ldg(u + e + i) : 0u;
			h[0] = q[0] | (q[1] << 16);
			h[1] = q[2] | (q[3] << 16);
		}
	}
	__device__ __forceinline__ void get(float v[4]) const {
		if constexpr (H == T_BF16) {
			// A bf16 is the top half of its float32: one instruction each.
			v[0] = __uint_as_float(h[0] << 16);
			v[1] = __uint_as_float(h[0] & 0xffff0000u);
			v[2] = __uint_as_float(h[1] << 16);
			v[3] = __uint_as_float(h[1] & 0xffff0000u);
		} else {
			v[0] = widen<H>(h[0] & 0xffffu);
			v[1] = widen<H>(h[0] >> 16);
			v[2] = widen<H>(h[1] & 0xffffu);
			v[3] = widen<H>(h[1] >> 16);
		}
	}
};
// load16 fills two half chunks, elements e..e+7 (e a multiple of 8, all
// in the row, the row 16-byte aligned), with one 16-byte load.
template <int H>
__device__ __forceinline__ void load16(HalfChunk<H>& a, HalfChunk<H>& b, const void* p, int e) {
	const uint4 t = __ldg(reinterpret_cast<const uint4*>((const unsigned short*)p + e));
	a.h[0] = t.x;
	a.h[1] = t.y;
	b.h[0] = t.z;
	b.h[1] = t.w;
}
template <>
struct Chunk<T_BF16> : HalfChunk<T_BF16> {};
template <>
struct Chunk<T_F16> : HalfChunk<T_F16> {};

// The rows of one group with each row held in registers: thread t of the
// T = blockDim.x owns the CW-element chunks t, t+T, ... (at most K of them)
// of every row, and, when dx is wanted, the same chunks of w, loaded once.
// A chunk is CW/4 pieces of 4 elements, the unit of the loads, the
// arithmetic and the stores; its elements are summed in order. CW is 4
// when x is F32 and 8 when x is BF16 or F16 (rms_cw), so that a half row
// is loaded 16 bytes at a time as an F32 row is: with 8-byte loads half
// rows stayed near 60-70% of the device copy on the H200 (docs/cuda.md).
// S rows are in registers at once (slots, as loaded: Chunk): while R of
// them are reduced and written, the next S-R of the group are in flight.
// The row loop is unrolled by S so that the slot index is a constant (a
// run-time index would put the arrays in local memory). Measured on the
// H200 (docs/cuda.md): holding w in registers instead of re-reading it
// twice per row took the register path from 77% to 93% of the device copy
// at 16384x4096 (run 4); one row in registers per block could not cover
// the memory latency (run 1).
//
// R rows share each block-sum barrier (block_sum; S is a multiple of R).
// WS (fused only) keeps w and the dw sums in shared memory instead of
// registers (32 fewer registers a thread at K*CW = 16, so that two blocks
// fit on a multiprocessor where one did), laid out element-major (element
// j of chunk c at j*nch + c) so that a warp's accesses fall in 32 banks;
// each thread touches only its own chunks, so no barrier guards them.
// Neither changes an operation or its order.
//
// RMS_PDL_TRIGGER (a benchmark variant, RMSGRAD_CUDA_NVRTC_OPTS) is where
// a fused rows block lets the dependent reduce launch (cuda/execute.go)
// begin (griddepcontrol.launch_dependents; the launch begins once every
// block of the grid has said so or ended): 1 as it starts, 3 as it starts
// its last rows, 2 after them; 0 (the default) as it ends. The reduce
// reads the partials only after the whole rows grid has finished
// (griddepcontrol.wait), whichever.
#ifndef RMS_PDL_TRIGGER
#define RMS_PDL_TRIGGER 0
#endif
#if !defined(RMS_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RMS_PDL_LAUNCH(at)                                                      \
	do {                                                                    \
		if (RMS_PDL_TRIGGER == (at)) asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
	} while (0)
#else
#define RMS_PDL_LAUNCH(at) ((void)0)
#endif

// FUSED is the worker's common case, compiled apart: every flag set (r
// computed and written, dx, dw) and dim a multiple of CW, so that the flag
// and bounds tests fold away. It runs the same instructions in the same
// order as the general path, so the bits are the same (TestKernelsOnCPU):
// the sums depend on T and CW (the elements each thread owns) and not on
// K, S, R or WS. IO is the dtype of x, dy and dx (T_ANY: each its own,
// read at run time).
template <int K, int S, int R, int WS, bool FUSED, int IO, int CW>
__device__ void rows_regs(const Job& J, int grp, float* red) {
	static_assert(S % R == 0 && R <= RMS_RMAX, "R rows a barrier, R dividing S");
	static_assert(FUSED || WS == 0, "w in shared memory on the fused path only");
	static_assert(WS >= 0 && WS <= 2, "WS: 0 registers, 1 element-major, 2 piece-major");
	static_assert(CW == 4 || CW == 8, "chunks of 4 or 8 elements");
	constexpr int P = CW / 4;  // pieces a chunk
	constexpr int KP = K * P;  // pieces a thread
	constexpr bool HALF = IO == T_BF16 || IO == T_F16;
	const int T = blockDim.x;
	const int dim = J.dim;
	const int nch = (dim + CW - 1) / CW;
	const bool vec = FUSED || (dim & 3) == 0; // every piece wholly in or out of the row
	const bool vec16 = HALF && CW == 8 && (FUSED || (dim & 7) == 0);
	const bool doR = FUSED || (J.flags & F_COMPUTE_R) != 0;
	const bool writeR = FUSED || (J.flags & F_WRITE_R) != 0;
	const bool doDX = FUSED || (J.flags & F_DX) != 0;
	const bool doDW = FUSED || (J.flags & F_DW) != 0;
	const bool needDY = doDX || doDW;
	const int t = threadIdx.x;
	// Local row b of the group is row grp + b*G of the job (rowOf).
	const int G = J.g;
	const int b1 = group_rows(J, grp);
	const int tx = IO == T_ANY ? TYPE_X(J) : IO, tdy = IO == T_ANY ? TYPE_DY(J) : IO;
	const int tdx = IO == T_ANY ? TYPE_DX(J) : IO, tw = TYPE_W(J);

	constexpr int KR = WS ? 1 : KP; // pieces of w and dw held in registers
	float wv[KR][4], dwacc[KR][4];
	float* sw = reinterpret_cast<float*>(rms_dyn); // WS only: w, then the dw sums
	float* sdw = sw + CW * nch;
	float4* sw4 = rms_dyn;                          // WS 2: the same, as pieces
	float4* sdw4 = sw4 + P * nch;
	// Element q of piece (k, h): chunk t + k*T, row element (t+k*T)*CW + 4h + q,
	// in shared memory at (4h + q)*nch + chunk (WS 1, element-major:
	// scalar accesses, a warp's in 32 banks) or as element q of the float4
	// h*nch + chunk (WS 2, piece-major: one 16-byte access a piece, a
	// warp's 512 consecutive bytes).
	Chunk<IO> xs[S][KP], ds[S][KP];
#pragma unroll
	for (int k = 0; k < K; k++) {
		const int c = t + k * T;
#pragma unroll
		for (int h = 0; h < P; h++) {
			const int e = c * CW + 4 * h;
			float w4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
			if (doDX && e < dim) loadT<T_ANY>(J.w, e, dim, vec, w4, tw);
			if constexpr (WS == 2) {
				if (c < nch) {
					sw4[h * nch + c] = make_float4(w4[0], w4[1], w4[2], w4[3]);
					sdw4[h * nch + c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
				}
			} else if constexpr (WS == 1) {
				if (c < nch) {
#pragma unroll
					for (int q = 0; q < 4; q++) {
						sw[(4 * h + q) * nch + c] = w4[q];
						sdw[(4 * h + q) * nch + c] = 0.0f;
					}
				}
			} else {
#pragma unroll
				for (int q = 0; q < 4; q++) {
					wv[k * P + h][q] = w4[q];
					dwacc[k * P + h][q] = 0.0f;
				}
			}
#pragma unroll
			for (int i = 0; i < S; i++) {
				xs[i][k * P + h].clear();
				ds[i][k * P + h].clear();
			}
		}
	}
	// getw gives piece (k, h)'s w.
	auto getw = [&](int k, int h, int c, float w4[4]) {
		if constexpr (WS == 2) {
			const float4 v = sw4[h * nch + c];
			w4[0] = v.x;
			w4[1] = v.y;
			w4[2] = v.z;
			w4[3] = v.w;
			return;
		}
#pragma unroll
		for (int q = 0; q < 4; q++) {
			if constexpr (WS == 1) w4[q] = sw[(4 * h + q) * nch + c];
			else w4[q] = wv[k * P + h][q];
		}
	};
	// load fills slot i with row b (nothing past the group's last row).
	auto load = [&](int i, int b) {
		if (b < b1) {
			const void* xr = at(J.x, rowOf(b) * dim, tx);
			const void* dyr = needDY ? at(J.dy, rowOf(b) * dim, tdy) : nullptr;
#pragma unroll
			for (int k = 0; k < K; k++) {
				const int c = t + k * T;
				if constexpr (HALF && CW == 8) {
					if (vec16) {
						if (c < nch) {
							load16(xs[i][2 * k], xs[i][2 * k + 1], xr, c * 8);
							if (needDY) load16(ds[i][2 * k], ds[i][2 * k + 1], dyr, c * 8);
						}
						continue;
					}
				}
#pragma unroll
				for (int h = 0; h < P; h++) {
					const int e = c * CW + 4 * h;
					if (e < dim) {
						xs[i][k * P + h].load(xr, e, dim, vec, tx);
						if (needDY) ds[i][k * P + h].load(dyr, e, dim, vec, tdy);
					}
				}
			}
		}
	};
#pragma unroll
	for (int i = 0; i < S; i++) load(i, i);
	for (int bb = 0; bb < b1; bb += S) {
		if constexpr (FUSED) {
			if (bb + S >= b1) RMS_PDL_LAUNCH(3);
		}
#pragma unroll
		for (int i0 = 0; i0 < S; i0 += R) {
			if (bb + i0 >= b1) break; // the same for the whole block
			float ss[R], s[R];
#pragma unroll
			for (int q = 0; q < R; q++) {
				ss[q] = s[q] = 0.0f;
				if ((doR || doDX) && bb + i0 + q < b1) {
#pragma unroll
					for (int k = 0; k < K; k++) {
						const int c = t + k * T;
#pragma unroll
						for (int h = 0; h < P; h++) {
							const int e = c * CW + 4 * h;
							if (e < dim) {
								float xv[4], dv[4], w4[4];
								xs[i0 + q][k * P + h].get(xv);
								ds[i0 + q][k * P + h].get(dv);
								getw(k, h, c, w4);
								accum(xv, dv, w4, e, dim, vec, doR, doDX, ss[q], s[q]);
							}
						}
					}
				}
			}
			if (doR || doDX) block_sum<R>(ss, s, red, ((bb + i0) / R) & 1);
#pragma unroll
			for (int q = 0; q < R; q++) {
				const int i = i0 + q, b = bb + i;
				if (b >= b1) break;
				float r = 0.0f, cc = 0.0f;
				if (doR) {
					r = rms_inv(ss[q], dim, J.eps);
					if (writeR && t == 0) J.r[rowOf(b)] = r;
				} else if (needDY) {
					r = J.r[rowOf(b)];
				}
				if (doDX) cc = __fdiv_rn(__fmul_rn(__fmul_rn(s[q], r), r), (float)dim);
				if (needDY) {
#pragma unroll
					for (int k = 0; k < K; k++) {
						const int c = t + k * T;
						float o[P][4];
#pragma unroll
						for (int h = 0; h < P; h++) {
							const int e = c * CW + 4 * h;
							if (e < dim) {
								float xv[4], dv[4];
								xs[i][k * P + h].get(xv);
								ds[i][k * P + h].get(dv);
								if (doDX) {
									float w4[4];
									getw(k, h, c, w4);
									dx4(xv, dv, w4, r, cc, o[h]);
									if (!FUSED && dim == 1) o[h][0] = dx_dim1(dv[0], w4[0], r, J.eps);
								}
								if (WS == 2 && doDW) {
									float4 a = sdw4[h * nch + c];
									a.x = __fmaf_rn(__fmul_rn(dv[0], xv[0]), r, a.x);
									a.y = __fmaf_rn(__fmul_rn(dv[1], xv[1]), r, a.y);
									a.z = __fmaf_rn(__fmul_rn(dv[2], xv[2]), r, a.z);
									a.w = __fmaf_rn(__fmul_rn(dv[3], xv[3]), r, a.w);
									sdw4[h * nch + c] = a;
								} else if (doDW) {
#pragma unroll
									for (int q2 = 0; q2 < 4; q2++) {
										if constexpr (WS == 1) {
											float& a = sdw[(4 * h + q2) * nch + c];
											a = __fmaf_rn(__fmul_rn(dv[q2], xv[q2]), r, a);
										} else {
											dwacc[k * P + h][q2] = __fmaf_rn(__fmul_rn(dv[q2], xv[q2]), r, dwacc[k * P + h][q2]);
										}
									}
								}
							}
						}
						if (doDX) {
							void* dxr = at(J.dx, rowOf(b) * dim, tdx);
							if constexpr (HALF && CW == 8) {
								if (vec16) {
									if (c < nch)
										ST_U4((unsigned short*)dxr + c * 8, narrow8<IO>(o));
									continue;
								}
							}
#pragma unroll
							for (int h = 0; h < P; h++) {
								const int e = c * CW + 4 * h;
								if (e < dim) storeT<IO>(dxr, e, dim, vec, o[h], tdx);
							}
						}
					}
				}
				load(i, b + S); // the slot this row used, S rows ahead
			}
		}
	}
	if constexpr (FUSED) RMS_PDL_LAUNCH(2);
	if (doDW) {
#pragma unroll
		for (int k = 0; k < K; k++) {
			const int c = t + k * T;
#pragma unroll
			for (int h = 0; h < P; h++) {
				const int e = c * CW + 4 * h;
				if (e < dim) {
					if constexpr (WS == 2) {
						const float4 v = sdw4[h * nch + c];
						const float a[4] = {v.x, v.y, v.z, v.w};
						store_dw(J, grp, e, dim, vec, a);
					} else if constexpr (WS == 1) {
						float a[4];
#pragma unroll
						for (int q = 0; q < 4; q++) a[q] = sdw[(4 * h + q) * nch + c];
						store_dw(J, grp, e, dim, vec, a);
					} else {
						store_dw(J, grp, e, dim, vec, dwacc[k * P + h]);
					}
				}
			}
		}
	}
}

// The rows of one group for dims that are a multiple of 4, up to RMS_KMAX
// chunks per thread of 256: a ring of J.stages row slots (x and dy) in
// shared memory filled by asynchronous copies, so stages-1 rows stay in
// flight while the current one is reduced and written. The arithmetic is
// that of rows_regs at 256 threads, chunk by chunk in the same order, so the
// bits are the same. x and dy are F32 here (the host gives half inputs no
// slots); w and dx may be of any dtype. Taken only when the host is asked
// to (RMSGRAD_CUDA_STAGES), which also makes the block 256 threads.
template <int K>
__device__ void rows_smem(const Job& J, int grp, float* red, float* sm) {
	const int dim = J.dim;
	const int nch = dim >> 2;
	const bool doR = (J.flags & F_COMPUTE_R) != 0;
	const bool doDX = (J.flags & F_DX) != 0;
	const bool doDW = (J.flags & F_DW) != 0;
	const bool needDY = doDX || doDW;
	const int t = threadIdx.x;
	const int S = J.stages;
	// Local row b of the group is row grp + b*G of the job (rowOf).
	const int G = J.g;
	const int b1 = group_rows(J, grp);
	const int tdx = TYPE_DX(J), tw = TYPE_W(J);

	float dwacc[K][4];
#pragma unroll
	for (int k = 0; k < K; k++)
#pragma unroll
		for (int q = 0; q < 4; q++) dwacc[k][q] = 0.0f;

	// Slot i holds x at sm + i*2*dim and dy right after it. Every thread
	// commits one group per issue (empty past the last row) so the wait
	// count is the same for all rows.
	auto issue = [&](int b) {
		if (b < b1) {
			float* sx = sm + (size_t)(b % S) * 2 * dim;
			const float* xr = (const float*)J.x + rowOf(b) * dim;
			const float* dyr = (const float*)J.dy + rowOf(b) * dim;
#pragma unroll
			for (int k = 0; k < K; k++) {
				const int c = t + k * RMS_THREADS;
				if (c < nch) {
					cp_async16(sx + c * 4, xr + c * 4);
					if (needDY) cp_async16(sx + dim + c * 4, dyr + c * 4);
				}
			}
		}
		cp_async_commit();
	};
	for (int i = 0; i < S - 1; i++) issue(i);
	for (int b = 0; b < b1; b++) {
		issue(b + S - 1); // into the slot row b-1 used
		cp_async_wait(S - 1);
		const float* sx = sm + (size_t)(b % S) * 2 * dim;
		const float* sd = sx + dim;
		float ss = 0.0f, s = 0.0f;
		if (doR || doDX) {
#pragma unroll
			for (int k = 0; k < K; k++) {
				const int c = t + k * RMS_THREADS;
				if (c < nch) {
					float xv[4], dv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, wv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
					load4rw(sx, c * 4, dim, true, xv);
					if (doDX) {
						load4rw(sd, c * 4, dim, true, dv);
						loadT<T_ANY>(J.w, c * 4, dim, true, wv, tw);
					}
					accum(xv, dv, wv, c * 4, dim, true, doR, doDX, ss, s);
				}
			}
			block_sum2(ss, s, red, b & 1);
		}
		float r = 0.0f, cc = 0.0f;
		if (doR) {
			r = rms_inv(ss, dim, J.eps);
			if ((J.flags & F_WRITE_R) && t == 0) J.r[rowOf(b)] = r;
		} else if (needDY) {
			r = J.r[rowOf(b)];
		}
		if (!needDY) continue;
		if (doDX) cc = __fdiv_rn(__fmul_rn(__fmul_rn(s, r), r), (float)dim);
#pragma unroll
		for (int k = 0; k < K; k++) {
			const int c = t + k * RMS_THREADS;
			if (c < nch) {
				float xv[4], dv[4];
				load4rw(sx, c * 4, dim, true, xv);
				load4rw(sd, c * 4, dim, true, dv);
				if (doDX) {
					float wv[4], o[4];
					loadT<T_ANY>(J.w, c * 4, dim, true, wv, tw);
					dx4(xv, dv, wv, r, cc, o);
					storeT<T_ANY>(at(J.dx, rowOf(b) * dim, tdx), c * 4, dim, true, o, tdx);
				}
				if (doDW) {
#pragma unroll
					for (int q = 0; q < 4; q++) dwacc[k][q] = __fmaf_rn(__fmul_rn(dv[q], xv[q]), r, dwacc[k][q]);
				}
			}
		}
	}
	cp_async_wait(0);
	if (doDW) {
#pragma unroll
		for (int k = 0; k < K; k++) {
			const int c = t + k * RMS_THREADS;
			if (c < nch) store_dw(J, grp, c * 4, dim, true, dwacc[k]);
		}
	}
}

// The rows of one group of a half-precision fused class with x and dy in P
// shared-memory slots (RMS_C9_SLOTS, a benchmark variant of c9): 16-byte
// asynchronous copies, each thread copying, waiting for and reading only
// its own chunks (no barrier between a copy and its read), keep P-R rows in
// flight while R rows are reduced and written; no row is held in registers
// (each is read from its slot twice: the sums, then dx and dw), w and the
// dw sums are. The arithmetic is rows_regs' fused path (CW 8) chunk by
// chunk in the same order, so at the same block size the bits are the same
// (TestHalfSlotsOnCPU). Slot i holds x's chunks at
// rms_dyn + i*2*nch and dy's after them: 4*P*dim bytes a block.
template <int K, int P, int R, int IO>
__device__ void rows_slots(const Job& J, int grp, float* red) {
	static_assert(IO == T_BF16 || IO == T_F16, "half rows");
	static_assert(R >= 1 && R < P && R <= RMS_RMAX && P - R <= 3, "R rows reduced while P-R (at most 3) are in flight");
	const int T = blockDim.x;
	const int dim = J.dim;
	const int nch = dim >> 3; // fused: dim is a multiple of 8
	const int t = threadIdx.x;
	// Local row b of the group is row grp + b*G of the job (rowOf).
	const int G = J.g;
	const int b1 = group_rows(J, grp);
	const int tw = TYPE_W(J);
	uint4* slots = reinterpret_cast<uint4*>(rms_dyn);
	float wv[2 * K][4], dwacc[2 * K][4];
#pragma unroll
	for (int k = 0; k < K; k++) {
		const int c = t + k * T;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			float w4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
			if (c < nch) loadT<T_ANY>(J.w, c * 8 + 4 * h, dim, true, w4, tw);
#pragma unroll
			for (int q = 0; q < 4; q++) {
				wv[2 * k + h][q] = w4[q];
				dwacc[2 * k + h][q] = 0.0f;
			}
		}
	}
	// issue copies row b into its slot and commits one group (empty past
	// the group's last row, so that every thread counts the same groups).
	auto issue = [&](int b) {
		if (b < b1) {
			uint4* sl = slots + (size_t)(b % P) * 2 * nch;
			const unsigned short* xr = (const unsigned short*)J.x + rowOf(b) * dim;
			const unsigned short* dyr = (const unsigned short*)J.dy + rowOf(b) * dim;
#pragma unroll
			for (int k = 0; k < K; k++) {
				const int c = t + k * T;
				if (c < nch) {
					cp_async16((float*)(sl + c), (const float*)(xr + c * 8));
					cp_async16((float*)(sl + nch + c), (const float*)(dyr + c * 8));
				}
			}
		}
		cp_async_commit();
	};
	// chunk reads chunk c of row b's x (d = 0) or dy (d = 1) from its slot.
	auto chunk = [&](int b, int d, int c, HalfChunk<IO>& lo, HalfChunk<IO>& hi) {
		const uint4 u = slots[(size_t)(b % P) * 2 * nch + d * nch + c];
		lo.h[0] = u.x;
		lo.h[1] = u.y;
		hi.h[0] = u.z;
		hi.h[1] = u.w;
	};
#pragma unroll
	for (int i = 0; i < P; i++) issue(i);
	for (int bb = 0; bb < b1; bb += R) {
		cp_async_wait(P - R); // rows bb .. bb+R-1 have landed (bb+P groups issued)
		float ss[R], s[R];
#pragma unroll
		for (int q = 0; q < R; q++) {
			ss[q] = s[q] = 0.0f;
			if (bb + q < b1) {
#pragma unroll
				for (int k = 0; k < K; k++) {
					const int c = t + k * T;
					if (c < nch) {
						HalfChunk<IO> xa[2], da[2];
						chunk(bb + q, 0, c, xa[0], xa[1]);
						chunk(bb + q, 1, c, da[0], da[1]);
#pragma unroll
						for (int h = 0; h < 2; h++) {
							float xv[4], dv[4];
							xa[h].get(xv);
							da[h].get(dv);
							accum(xv, dv, wv[2 * k + h], c * 8 + 4 * h, dim, true, true, true, ss[q], s[q]);
						}
					}
				}
			}
		}
		block_sum<R>(ss, s, red, (bb / R) & 1);
#pragma unroll
		for (int q = 0; q < R; q++) {
			const int b = bb + q;
			if (b >= b1) break;
			const float r = rms_inv(ss[q], dim, J.eps);
			if (t == 0) J.r[rowOf(b)] = r;
			const float cc = __fdiv_rn(__fmul_rn(__fmul_rn(s[q], r), r), (float)dim);
			unsigned short* dxr = (unsigned short*)J.dx + rowOf(b) * dim;
#pragma unroll
			for (int k = 0; k < K; k++) {
				const int c = t + k * T;
				if (c < nch) {
					HalfChunk<IO> xa[2], da[2];
					chunk(b, 0, c, xa[0], xa[1]);
					chunk(b, 1, c, da[0], da[1]);
					float o[2][4];
#pragma unroll
					for (int h = 0; h < 2; h++) {
						float xv[4], dv[4];
						xa[h].get(xv);
						da[h].get(dv);
						dx4(xv, dv, wv[2 * k + h], r, cc, o[h]);
#pragma unroll
						for (int q2 = 0; q2 < 4; q2++)
							dwacc[2 * k + h][q2] = __fmaf_rn(__fmul_rn(dv[q2], xv[q2]), r, dwacc[2 * k + h][q2]);
					}
					ST_U4(dxr + c * 8, narrow8<IO>(o));
				}
			}
		}
		// This thread is done with rows bb .. bb+R-1: their slots take the
		// rows P ahead.
#pragma unroll
		for (int q = 0; q < R; q++) issue(bb + q + P);
	}
	cp_async_wait(0);
#pragma unroll
	for (int k = 0; k < K; k++) {
		const int c = t + k * T;
#pragma unroll
		for (int h = 0; h < 2; h++)
			if (c < nch) store_dw(J, grp, c * 8 + 4 * h, dim, true, dwacc[2 * k + h]);
	}
}

// The rows of one group for dims over 4 chunks per thread without slots:
// the same arithmetic, re-reading x and dy, the dw accumulator living in
// the group's partial row (only this thread touches these columns of this
// group). IO and CW as for rows_regs; T = blockDim.x.
template <int IO, int CW>
__device__ void rows_stream(const Job& J, int grp, float* red) {
	constexpr int P = CW / 4;
	const int T = blockDim.x;
	const int dim = J.dim;
	const int nch = (dim + CW - 1) / CW;
	const bool vec = (dim & 3) == 0;
	const bool doR = (J.flags & F_COMPUTE_R) != 0;
	const bool doDX = (J.flags & F_DX) != 0;
	const bool doDW = (J.flags & F_DW) != 0;
	const bool needDY = doDX || doDW;
	const int t = threadIdx.x;
	// Local row b of the group is row grp + b*G of the job (rowOf).
	const int G = J.g;
	const int b1 = group_rows(J, grp);
	const int tx = IO == T_ANY ? TYPE_X(J) : IO, tdy = IO == T_ANY ? TYPE_DY(J) : IO;
	const int tdx = IO == T_ANY ? TYPE_DX(J) : IO, tw = TYPE_W(J);
	float* part = J.part + (size_t)grp * dim;
	for (int b = 0; b < b1; b++) {
		const void* xr = at(J.x, rowOf(b) * dim, tx);
		const void* dyr = needDY ? at(J.dy, rowOf(b) * dim, tdy) : nullptr;
		float ss = 0.0f, s = 0.0f;
		if (doR || doDX) {
			for (int c = t; c < nch; c += T) {
#pragma unroll
				for (int h = 0; h < P; h++) {
					const int e = c * CW + 4 * h;
					if (e >= dim) break;
					float x4[4], d4[4] = {0.0f, 0.0f, 0.0f, 0.0f}, w4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
					loadT<IO>(xr, e, dim, vec, x4, tx);
					if (doDX) {
						loadT<IO>(dyr, e, dim, vec, d4, tdy);
						loadT<T_ANY>(J.w, e, dim, vec, w4, tw);
					}
					accum(x4, d4, w4, e, dim, vec, doR, doDX, ss, s);
				}
			}
			block_sum2(ss, s, red, b & 1);
		}
		float r = 0.0f, cc = 0.0f;
		if (doR) {
			r = rms_inv(ss, dim, J.eps);
			if ((J.flags & F_WRITE_R) && t == 0) J.r[rowOf(b)] = r;
		} else if (needDY) {
			r = J.r[rowOf(b)];
		}
		if (!needDY) continue;
		if (doDX) cc = __fdiv_rn(__fmul_rn(__fmul_rn(s, r), r), (float)dim);
		for (int c = t; c < nch; c += T) {
#pragma unroll
			for (int h = 0; h < P; h++) {
				const int e = c * CW + 4 * h;
				if (e >= dim) break;
				float x4[4], d4[4];
				loadT<IO>(xr, e, dim, vec, x4, tx);
				loadT<IO>(dyr, e, dim, vec, d4, tdy);
				if (doDX) {
					float w4[4], o[4];
					loadT<T_ANY>(J.w, e, dim, vec, w4, tw);
					dx4(x4, d4, w4, r, cc, o);
					if (dim == 1) o[0] = dx_dim1(d4[0], w4[0], r, J.eps);
					storeT<IO>(at(J.dx, rowOf(b) * dim, tdx), e, dim, vec, o, tdx);
				}
				if (doDW) {
					float a[4], o[4];
					if (b == 0) {
						a[0] = a[1] = a[2] = a[3] = 0.0f;
					} else {
						load4rw(part, e, dim, vec, a);
					}
#pragma unroll
					for (int q = 0; q < 4; q++) o[q] = __fmaf_rn(__fmul_rn(d4[q], x4[q]), r, a[q]);
					store4(part, e, dim, vec, o);
				}
			}
		}
	}
	if (doDW && J.g == 1) {
		// One group: dw from the sums this thread kept in the partial row.
		for (int c = t; c < nch; c += T) {
#pragma unroll
			for (int h = 0; h < P; h++) {
				const int e = c * CW + 4 * h;
				if (e >= dim) break;
				float a[4];
				load4rw(part, e, dim, vec, a);
				store_dw(J, grp, e, dim, vec, a);
			}
		}
	}
}

// rows_cw is the chunk width of a job's rows: 8 elements when x is BF16 or
// F16, else 4 (cuda/geometry.go's classOf takes the same).
__device__ __forceinline__ int rows_cw(const Job& J) { return TYPE_X(J) == T_F32 ? 4 : 8; }

// rows_any runs one group of a general rows entry: the register path up to
// 4 chunks per thread, streaming beyond, with x, dy and dx of type IO.
template <int IO, int CW>
__device__ __forceinline__ void rows_any(const Job& J, int grp, float* red, int K) {
	switch (K) {
	case 1:
		rows_regs<1, 2, 1, 0, false, IO, CW>(J, grp, red);
		break;
	case 2:
		rows_regs<2, 2, 1, 0, false, IO, CW>(J, grp, red);
		break;
	case 3:
	case 4:
		rows_regs<4, 2, 1, 0, false, IO, CW>(J, grp, red);
		break;
	default:
		// Over 4 chunks per thread: x and dy re-read, no register arrays.
		rows_stream<IO, CW>(J, grp, red);
	}
}

// The general rows kernel: any flags, any dtypes, any dim. grid: (total
// groups of the launch's jobs); bmap[blockIdx.x] is the block's job, its
// group blockIdx.x - jobs[j].start. The block size (up to 512) is the one
// the host gives the job's dim and chunk width, the same as the fused
// class's below, so an RMSInv, DX and DW run apart give the bits of the
// fused pass.
#define RMS_GEN_THREADS 512
#if RMS_PART_IS(0)
extern "C" __global__ void __launch_bounds__(RMS_GEN_THREADS, 1)
    rms_norm_backward_rows_f32(const Job* __restrict__ jobs, const int* __restrict__ bmap) {
	__shared__ float red[2 * 2 * 32];
	const Job J = jobs[bmap[blockIdx.x]];
	const int grp = blockIdx.x - J.start;
	const int cw = rows_cw(J);
	const int nch = (J.dim + cw - 1) / cw;
	const int K = (nch + blockDim.x - 1) / blockDim.x;
	if (J.stages > 0) {
		// dim % 4 == 0, K <= RMS_KMAX, x and dy F32 and 256 threads (the
		// host sets stages only then, and only when RMSGRAD_CUDA_STAGES
		// asks for this path).
		float* sm = reinterpret_cast<float*>(rms_dyn);
		switch (K) {
		case 1:
			rows_smem<1>(J, grp, red, sm);
			break;
		case 2:
			rows_smem<2>(J, grp, red, sm);
			break;
		case 3:
		case 4:
			rows_smem<4>(J, grp, red, sm);
			break;
		default:
			rows_smem<8>(J, grp, red, sm);
		}
		return;
	}
	// IO F32 means x is F32 (chunks of 4), BF16 and F16 that x is half
	// (chunks of 8); T_ANY takes either.
	switch (TYPE_IO(J)) {
	case T_F32:
		rows_any<T_F32, 4>(J, grp, red, K);
		break;
	case T_BF16:
		rows_any<T_BF16, 8>(J, grp, red, K);
		break;
	case T_F16:
		rows_any<T_F16, 8>(J, grp, red, K);
		break;
	default:
		if (cw == 8) rows_any<T_ANY, 8>(J, grp, red, K);
		else rows_any<T_ANY, 4>(J, grp, red, K);
	}
}

#endif
// The fused kernels (every flag set, x, dy and dx of one dtype, dim a
// multiple of the chunk width), one per width class of the register path,
// compiled apart so that the general path's register pressure does not
// make them spill. Classes c0-c6 take F32 rows (chunks of 4), c7-c12
// BF16 and F16 rows (chunks of 8; c12, 1152-2048, sits after c11 in the
// table: the host takes the narrowest class that holds a row). Class c takes dims of up to
// CW*K*MAXT elements (c4, c7, c9 and c10 fewer, below) with K chunks per thread, blocks of T =
// 32*ceil(nch/K/32) threads (so the block fits the row: at most 31 idle
// threads), RMS_Cc_S rows in registers and RMS_Cc_R rows a block-sum
// barrier. The launch bounds (most threads, fewest blocks per SM) cap the
// registers; the host sizes the grid from each class's occupancy
// (cuda/geometry.go). WS classes keep w and the dw sums in shared memory,
// 8*dim bytes a block, so that more blocks fit on a multiprocessor.
// Measured on the H200 (docs/cuda.md, cuda/variants/rows.cu): S=2 beat S=3
// in c1, c2 and c4 (S=3 spilled in c1), S=3 won in c0 for batches of small
// jobs; two rows a barrier gained 5-7 points in c2 and in the
// one-block-per-SM classes c5 and c6, and lost 2-3 in c3; WS took 5120 from 83% to
// 95%. Half rows: 16-byte loads of 8 elements with w in shared memory and
// 2-4 blocks per SM reached 91% at 32768x8192 and 83% at 16384x4096,
// against 70-78% with 8-byte loads and w in registers. On the H100
// (docs/cuda.md, runs 17-18), two chunks a thread in blocks of 256, three
// per SM, won 4 points at 16384x4096 in the harness and lost 1.5-2 in the
// backend while one kernel held both half dtypes: at the 80 registers of
// three blocks a SM it spilled 56 bytes, where a kernel of one dtype
// spills none (NVRTC 11.8 and the harness's nvcc alike). Each half class
// is therefore two kernels, one per dtype (RMS_FUSED_HALF). In the
// backend (runs 23-24, docs/cuda.md), two rows a barrier in c8 beat one
// by 2-4 points from 2176 to 4096 (88.3-88.6% against 84.5-85.8% at
// 16384x4096), and one row a barrier in c9 lost 1.6-2 points at
// 16384x8192 (run 18). c1 (f32, 1152-2048) holds one row in registers
// at one row a barrier: 2-6 points over two rows at every c1 dim in H100
// run 34 (90.0-94.3% against 85.8-89.3%), the default alternated before
// and after. In H100 runs 35-37 c0 in blocks of up to 128 threads, two
// chunks each, four blocks a SM, ran 16384x1024 at 87.1-89.4% against
// 83.0-86.3% (and the 256-job batch of 8x1024 at 0.073 us a job against
// 0.071); c7 in the same geometry with two rows in registers (four
// spilled under NVRTC 11.8) gained 3-5 points at bf16 1024-2048. The S
// and R macros may be overridden (RMSGRAD_CUDA_NVRTC_OPTS) to compare.
#ifndef RMS_C0_S
#define RMS_C0_S 3
#endif
#ifndef RMS_C1_S
#define RMS_C1_S 1
#endif
#ifndef RMS_C2_S
#define RMS_C2_S 2
#endif
#ifndef RMS_C3_S
#define RMS_C3_S 2
#endif
#ifndef RMS_C4_S
#define RMS_C4_S 2
#endif
#ifndef RMS_C5_S
#define RMS_C5_S 2
#endif
#ifndef RMS_C6_S
#define RMS_C6_S 2
#endif
#ifndef RMS_C7_S
#define RMS_C7_S 2
#endif
#ifndef RMS_C8_S
#define RMS_C8_S 2
#endif
#ifndef RMS_C9_S
#define RMS_C9_S 2
#endif
#ifndef RMS_C0_R
#define RMS_C0_R 3
#endif
#ifndef RMS_C1_R
#define RMS_C1_R 1
#endif
#ifndef RMS_C2_R
#define RMS_C2_R 2
#endif
#ifndef RMS_C3_R
#define RMS_C3_R 1
#endif
#ifndef RMS_C4_R
#define RMS_C4_R 1
#endif
#ifndef RMS_C5_R
#define RMS_C5_R 2
#endif
#ifndef RMS_C6_R
#define RMS_C6_R 1
#endif
#ifndef RMS_C7_R
#define RMS_C7_R 2
#endif
#ifndef RMS_C8_R
#define RMS_C8_R 2
#endif
#ifndef RMS_C9_R
#define RMS_C9_R 2
#endif
// The layout of w and the dw sums of the classes that keep them in shared
// memory (c4, c8-c12; rows_regs' WS): 2 piece-major, one 16-byte access a
// piece of 4 elements; 1 element-major, four scalar accesses. The same
// operations in the same order either way, so the same bits. On the H100
// (runs 42-44, docs/cuda.md), piece-major took bf16 in c8 (2176-4096) up
// 2.4-5.7 points (16384x4096: 91.6% against 88.8%) and in c9 (4224-8192)
// 3.0-5.7 points (8192: 93.5% against 90.5%); f32 in c4 moved within the
// noise. c8 spills 8 bytes in it under NVRTC 11.8 and is still the faster:
// updating the dw sums after the chunk's dx store spills none and ran
// 0.5-2.2 points slower (a tie at 3072); w piece-major with the dw sums
// element-major lost 4.4-5.7 points to element-major at 3072-4096.
#ifndef RMS_C4_WS
#define RMS_C4_WS 2
#endif
#ifndef RMS_C8_WS
#define RMS_C8_WS 2
#endif
#ifndef RMS_C9_WS
#define RMS_C9_WS 2
#endif
#ifndef RMS_C10_WS
#define RMS_C10_WS 2
#endif
#ifndef RMS_C11_WS
#define RMS_C11_WS 2
#endif
#ifndef RMS_C12_WS
#define RMS_C12_WS 2
#endif
// The other classes hold w and the dw sums in registers (WS 0); a
// benchmark variant (RMSGRAD_CUDA_CLASS_GEOM's "s", which also gives the
// blocks their 8*dim bytes) may move them to shared memory.
#ifndef RMS_C0_WS
#define RMS_C0_WS 0
#endif
#ifndef RMS_C1_WS
#define RMS_C1_WS 0
#endif
#ifndef RMS_C2_WS
#define RMS_C2_WS 0
#endif
#ifndef RMS_C3_WS
#define RMS_C3_WS 0
#endif
#ifndef RMS_C5_WS
#define RMS_C5_WS 0
#endif
#ifndef RMS_C6_WS
#define RMS_C6_WS 0
#endif
#ifndef RMS_C7_WS
#define RMS_C7_WS 0
#endif
// Each class's chunks per thread (K), most threads a block (MAXT) and
// fewest blocks per SM (MINB) may be overridden for benchmark variants
// with K*MAXT unchanged (the host's RMSGRAD_CUDA_CLASS_GEOM passes them,
// with its own table changed to match: cuda/geometry.go).
#ifndef RMS_C0_K
#define RMS_C0_K 2
#endif
#ifndef RMS_C0_MAXT
#define RMS_C0_MAXT 128
#endif
#ifndef RMS_C0_MINB
#define RMS_C0_MINB 4
#endif
#ifndef RMS_C1_K
#define RMS_C1_K 2
#endif
#ifndef RMS_C1_MAXT
#define RMS_C1_MAXT 256
#endif
#ifndef RMS_C1_MINB
#define RMS_C1_MINB 3
#endif
#ifndef RMS_C2_K
#define RMS_C2_K 3
#endif
#ifndef RMS_C2_MAXT
#define RMS_C2_MAXT 256
#endif
#ifndef RMS_C2_MINB
#define RMS_C2_MINB 2
#endif
#ifndef RMS_C3_K
#define RMS_C3_K 4
#endif
#ifndef RMS_C3_MAXT
#define RMS_C3_MAXT 256
#endif
#ifndef RMS_C3_MINB
#define RMS_C3_MINB 2
#endif
#ifndef RMS_C4_K
#define RMS_C4_K 4
#endif
#ifndef RMS_C4_MAXT
#define RMS_C4_MAXT 320
#endif
#ifndef RMS_C4_MINB
#define RMS_C4_MINB 2
#endif
#ifndef RMS_C5_K
#define RMS_C5_K 4
#endif
#ifndef RMS_C5_MAXT
#define RMS_C5_MAXT 384
#endif
#ifndef RMS_C5_MINB
#define RMS_C5_MINB 1
#endif
#ifndef RMS_C6_K
#define RMS_C6_K 4
#endif
#ifndef RMS_C6_MAXT
#define RMS_C6_MAXT 512
#endif
#ifndef RMS_C6_MINB
#define RMS_C6_MINB 1
#endif
#ifndef RMS_C7_K
#define RMS_C7_K 2
#endif
#ifndef RMS_C7_MAXT
#define RMS_C7_MAXT 128
#endif
#ifndef RMS_C7_MINB
#define RMS_C7_MINB 4
#endif
#ifndef RMS_C8_K
#define RMS_C8_K 2
#endif
#ifndef RMS_C8_MAXT
#define RMS_C8_MAXT 256
#endif
#ifndef RMS_C9_K
#define RMS_C9_K 4
#endif
#ifndef RMS_C9_MAXT
#define RMS_C9_MAXT 256
#endif
#ifndef RMS_C9_MINB
#define RMS_C9_MINB 2
#endif
// c10 (bf16 and f16 5248-6144): c9's chunks at one row in registers and
// one a barrier, launch bounds of three blocks of 256 a SM.
#ifndef RMS_C10_K
#define RMS_C10_K 4
#endif
#ifndef RMS_C10_S
#define RMS_C10_S 1
#endif
#ifndef RMS_C10_R
#define RMS_C10_R 1
#endif
#ifndef RMS_C10_MAXT
#define RMS_C10_MAXT 256
#endif
#ifndef RMS_C10_MINB
#define RMS_C10_MINB 3
#endif
// c11 (bf16 and f16 6272-8192): c9's geometry.
#ifndef RMS_C11_K
#define RMS_C11_K 4
#endif
#ifndef RMS_C11_S
#define RMS_C11_S 2
#endif
#ifndef RMS_C11_R
#define RMS_C11_R 2
#endif
#ifndef RMS_C11_MAXT
#define RMS_C11_MAXT 256
#endif
#ifndef RMS_C11_MINB
#define RMS_C11_MINB 2
#endif
// c12 (bf16 and f16 1152-2048): c7's chunks and rows with w and the dw
// sums in shared memory and launch bounds of six blocks of 128 a SM.
#ifndef RMS_C12_K
#define RMS_C12_K 2
#endif
#ifndef RMS_C12_S
#define RMS_C12_S 2
#endif
#ifndef RMS_C12_R
#define RMS_C12_R 2
#endif
#ifndef RMS_C12_MAXT
#define RMS_C12_MAXT 128
#endif
#ifndef RMS_C12_MINB
#define RMS_C12_MINB 6
#endif
#define RMS_FUSED_PROLOGUE                               \
	__shared__ float red[2 * 2 * RMS_RMAX * 32];     \
	RMS_PDL_LAUNCH(1);                               \
	const Job J = jobs[bmap[blockIdx.x]];            \
	const int grp = blockIdx.x - J.start;
// An F32 class (chunks of 4).
#define RMS_FUSED_F32(NAME, K, S, R, WS, MAXT, MINB)                                 \
	extern "C" __global__ void __launch_bounds__(MAXT, MINB)                       \
	    NAME(const Job* __restrict__ jobs, const int* __restrict__ bmap) {          \
		RMS_FUSED_PROLOGUE                                                       \
		rows_regs<K, S, R, WS, true, T_F32, 4>(J, grp, red);                     \
	}
// A BF16 or an F16 class (chunks of 8): each half class is two kernels,
// one per dtype (IO), since one kernel holding both rows_regs spills at
// three blocks a SM where either alone does not.
#define RMS_FUSED_HALF(NAME, IO, K, S, R, WS, MAXT, MINB)                            \
	extern "C" __global__ void __launch_bounds__(MAXT, MINB)                       \
	    NAME(const Job* __restrict__ jobs, const int* __restrict__ bmap) {          \
		RMS_FUSED_PROLOGUE                                                       \
		rows_regs<K, S, R, WS, true, IO, 8>(J, grp, red);                        \
	}
// cuda/geometry.go's fusedClasses must match these (cw, k, maxNch <=
// K*MAXT, MAXT, MINB, WS).
// c0: F32 dims up to 1024 (256 chunks), 2 chunks per thread, four blocks
// of up to 128 per SM.
#if RMS_PART_IS(2)
RMS_FUSED_F32(rms_norm_backward_rows_fused_c0, RMS_C0_K, RMS_C0_S, RMS_C0_R, RMS_C0_WS, RMS_C0_MAXT, RMS_C0_MINB)
#endif
// c1: up to 2048, 2 chunks per thread.
#if RMS_PART_IS(3)
RMS_FUSED_F32(rms_norm_backward_rows_fused_c1, RMS_C1_K, RMS_C1_S, RMS_C1_R, RMS_C1_WS, RMS_C1_MAXT, RMS_C1_MINB)
#endif
// c2: up to 3072, 3 chunks per thread.
#if RMS_PART_IS(4)
RMS_FUSED_F32(rms_norm_backward_rows_fused_c2, RMS_C2_K, RMS_C2_S, RMS_C2_R, RMS_C2_WS, RMS_C2_MAXT, RMS_C2_MINB)
#endif
// c3: up to 4096, 4 chunks per thread, two blocks of up to 256 per SM.
#if RMS_PART_IS(5)
RMS_FUSED_F32(rms_norm_backward_rows_fused_c3, RMS_C3_K, RMS_C3_S, RMS_C3_R, RMS_C3_WS, RMS_C3_MAXT, RMS_C3_MINB)
#endif
// c4: up to 4352 (its blocks would hold 5120), 4 chunks per thread, two
// blocks of up to 320 per SM, w and the dw sums in shared memory. 4480 to
// 5120 go to c5 (one block a SM, two rows a barrier, w in registers): on
// the H100 (runs 38-39, docs/cuda.md) 93.3-97.1% of copy there against
// 90.9-92.5% in c4; c4 kept 4224 (92.6-93.0% against 91.7-92.2% in c5).
#if RMS_PART_IS(6)
RMS_FUSED_F32(rms_norm_backward_rows_fused_c4, RMS_C4_K, RMS_C4_S, RMS_C4_R, RMS_C4_WS, RMS_C4_MAXT, RMS_C4_MINB)
#endif
// c5: 4480 up to 6144, 4 chunks per thread, one block of up to 384 per SM
// (the registers of two rows and w: up to 168 a thread).
#if RMS_PART_IS(7)
RMS_FUSED_F32(rms_norm_backward_rows_fused_c5, RMS_C5_K, RMS_C5_S, RMS_C5_R, RMS_C5_WS, RMS_C5_MAXT, RMS_C5_MINB)
#endif
// c6: up to 8192, 4 chunks per thread, one block of up to 512 per SM, one
// row a barrier: on the H100 (run 48, docs/cuda.md, alternated with two)
// 0.8-2.6 points more at 6272-8192 (7168: 96.6% against 93.6-94.1%), as
// the harness had found in run 41.
#if RMS_PART_IS(8)
RMS_FUSED_F32(rms_norm_backward_rows_fused_c6, RMS_C6_K, RMS_C6_S, RMS_C6_R, RMS_C6_WS, RMS_C6_MAXT, RMS_C6_MINB)
#endif
// c7: BF16 and F16 dims up to 1024 (its blocks would hold 2048: c12 takes
// 1152-2048), 2 chunks of 8 per thread, four blocks of up to 128 per SM,
// two rows in registers (parts 9 and 15: the BF16 and the F16 kernel).
#if RMS_PART_IS(9)
RMS_FUSED_HALF(rms_norm_backward_rows_fused_c7, T_BF16, RMS_C7_K, RMS_C7_S, RMS_C7_R, RMS_C7_WS, RMS_C7_MAXT, RMS_C7_MINB)
#endif
#if RMS_PART_IS(15)
RMS_FUSED_HALF(rms_norm_backward_rows_fused_c7_f16, T_F16, RMS_C7_K, RMS_C7_S, RMS_C7_R, RMS_C7_WS, RMS_C7_MAXT, RMS_C7_MINB)
#endif
// c8: BF16 and F16 dims up to 4096, 2 chunks of 8 per thread, blocks of
// up to 256 (three per SM at 256: RMS_C8_MINB), w and the dw sums in
// shared memory (parts 10 and 16).
#ifndef RMS_C8_MINB
#define RMS_C8_MINB 3
#endif
#if RMS_PART_IS(10)
RMS_FUSED_HALF(rms_norm_backward_rows_fused_c8, T_BF16, RMS_C8_K, RMS_C8_S, RMS_C8_R, RMS_C8_WS, RMS_C8_MAXT, RMS_C8_MINB)
#endif
#if RMS_PART_IS(16)
RMS_FUSED_HALF(rms_norm_backward_rows_fused_c8_f16, T_F16, RMS_C8_K, RMS_C8_S, RMS_C8_R, RMS_C8_WS, RMS_C8_MAXT, RMS_C8_MINB)
#endif
// c9: BF16 and F16 dims 4224 up to 5120, 4 chunks of 8 per thread, blocks
// of up to 256 (three per SM at its 160 threads), w and the dw sums in
// shared memory (parts 11 and 17). RMS_C9_SLOTS=P (the host's RMSGRAD_CUDA_HALF_SLOTS):
// x and dy in P shared-memory slots instead (rows_slots; RMS_C9_SLOTS_R
// rows a barrier, default 1), w and the dw sums in registers.
#ifdef RMS_C9_SLOTS
#ifndef RMS_C9_SLOTS_R
#define RMS_C9_SLOTS_R 1
#endif
#define RMS_FUSED_C9(NAME, IO)                                                      \
	extern "C" __global__ void __launch_bounds__(256, 2)                           \
	    NAME(const Job* __restrict__ jobs, const int* __restrict__ bmap) {          \
		RMS_FUSED_PROLOGUE                                                       \
		rows_slots<4, RMS_C9_SLOTS, RMS_C9_SLOTS_R, IO>(J, grp, red);            \
	}
#else
#define RMS_FUSED_C9(NAME, IO) RMS_FUSED_HALF(NAME, IO, RMS_C9_K, RMS_C9_S, RMS_C9_R, RMS_C9_WS, RMS_C9_MAXT, RMS_C9_MINB)
#endif
#if RMS_PART_IS(11)
RMS_FUSED_C9(rms_norm_backward_rows_fused_c9, T_BF16)
#endif
#if RMS_PART_IS(17)
RMS_FUSED_C9(rms_norm_backward_rows_fused_c9_f16, T_F16)
#endif
// c10: BF16 and F16 dims 5248 up to 6144, c9's chunks in blocks of up to
// 256, three a SM at 256 (four at the 192 threads of these dims), one row
// in registers and one a barrier, w and the dw sums in shared memory
// (parts 12 and 18). On the H100 (run 46, docs/cuda.md) this kernel, then
// serving all of c9's dims, ran 5248 at 87.1% of copy against 79.9% and
// 6144 at 90.5% against 85.7% (two blocks of 192 a SM at two rows), and
// lost 3.3-4.8 points at 7168-8192, which c11 keeps.
#if RMS_PART_IS(12)
RMS_FUSED_HALF(rms_norm_backward_rows_fused_c10, T_BF16, RMS_C10_K, RMS_C10_S, RMS_C10_R, RMS_C10_WS, RMS_C10_MAXT, RMS_C10_MINB)
#endif
#if RMS_PART_IS(18)
RMS_FUSED_HALF(rms_norm_backward_rows_fused_c10_f16, T_F16, RMS_C10_K, RMS_C10_S, RMS_C10_R, RMS_C10_WS, RMS_C10_MAXT, RMS_C10_MINB)
#endif
// c11: BF16 and F16 dims 6272 up to 8192, c9's geometry (parts 13 and 19).
#if RMS_PART_IS(13)
RMS_FUSED_HALF(rms_norm_backward_rows_fused_c11, T_BF16, RMS_C11_K, RMS_C11_S, RMS_C11_R, RMS_C11_WS, RMS_C11_MAXT, RMS_C11_MINB)
#endif
#if RMS_PART_IS(19)
RMS_FUSED_HALF(rms_norm_backward_rows_fused_c11_f16, T_F16, RMS_C11_K, RMS_C11_S, RMS_C11_R, RMS_C11_WS, RMS_C11_MAXT, RMS_C11_MINB)
#endif
// c12: BF16 and F16 dims 1152 up to 2048, c7's kernel with w and the dw
// sums in shared memory, six blocks a SM (parts 14 and 20). On the H100
// (runs 46 and 48, docs/cuda.md) this geometry, then serving all of c7's
// dims, ran bf16 1536 and 2048 2.5-5 points over c7's and 1024 2-4 points
// under, which c7 keeps.
#if RMS_PART_IS(14)
RMS_FUSED_HALF(rms_norm_backward_rows_fused_c12, T_BF16, RMS_C12_K, RMS_C12_S, RMS_C12_R, RMS_C12_WS, RMS_C12_MAXT, RMS_C12_MINB)
#endif
#if RMS_PART_IS(20)
RMS_FUSED_HALF(rms_norm_backward_rows_fused_c12_f16, T_F16, RMS_C12_K, RMS_C12_S, RMS_C12_R, RMS_C12_WS, RMS_C12_MAXT, RMS_C12_MINB)
#endif

#if RMS_PART_IS(1)
// Reduce layout: a block of RED_SL*RED_CH threads sums RED_CH chunks of 4
// columns over all G partials with RED_SL slices; slice s adds partials s,
// s+RED_SL, ... in order, then slice sums are added in slice order. The
// bits depend on RED_SL only; RMS_RED_CH (cuda/plan.go's redChunks, set
// with RMSGRAD_CUDA_RED_CH) trades blocks for columns a block.
#ifndef RMS_RED_CH
#define RMS_RED_CH 8
#endif
#define RED_CH RMS_RED_CH
#define RED_SL 32
// RMS_RED_U: loads in flight per step of a slice (the adds stay in group
// order, so any value gives the same bits).
#ifndef RMS_RED_U
#define RMS_RED_U 4
#endif
// RMS_RED_EARLY (1): the block reads its job entry before it waits for the
// rows grid; 0 after (a benchmark variant).
#ifndef RMS_RED_EARLY
#define RMS_RED_EARLY 1
#endif

// dw[i] = sum over groups of part[g, i] in a fixed tree, stored in dw's
// dtype. grid: (total reduce blocks); bmap[blockIdx.x] is the block's job.
extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    rms_norm_dw_reduce_f32(const Job* __restrict__ jobs, const int* __restrict__ bmap) {
	__shared__ float4 sm[RED_SL][RED_CH];
#if RMS_RED_EARLY
	// The job table is the host's, which no kernel writes: read before the
	// wait, so that a block already resident (RMS_PDL_TRIGGER) has its job
	// when the rows grid ends.
	const Job J = jobs[bmap[blockIdx.x]];
#endif
#if !defined(RMS_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	// Launched as a programmatic dependent launch of the rows kernel
	// (cuda/execute.go): wait until that grid has finished and its partials
	// are visible. A no-op when launched the ordinary way.
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if !RMS_RED_EARLY
	const Job J = jobs[bmap[blockIdx.x]];
#endif
	const int dim = J.dim;
	const bool vec = (dim & 3) == 0;
	const int ci = threadIdx.x % RED_CH, sl = threadIdx.x / RED_CH;
	const int c = (blockIdx.x - J.rstart) * RED_CH + ci;
	const int e = c * 4;
	float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	if (e < dim) {
		int g = sl;
		// RMS_RED_U loads in flight per step (a dependent load per add
		// left the reduction latency-bound); the adds stay in group order.
#ifdef RMS_RED_SKIP
		// A benchmark probe: the reduce's launch and wait without its work
		// (dw is wrong).
		g = J.g;
#endif
		for (; g + (RMS_RED_U - 1) * RED_SL < J.g; g += RMS_RED_U * RED_SL) {
			float u[RMS_RED_U][4];
#pragma unroll
			for (int i = 0; i < RMS_RED_U; i++) load4rw(J.part + (size_t)(g + i * RED_SL) * dim, e, dim, vec, u[i]);
#pragma unroll
			for (int i = 0; i < RMS_RED_U; i++)
#pragma unroll
				for (int q = 0; q < 4; q++) a[q] = __fadd_rn(a[q], u[i][q]);
		}
		for (; g < J.g; g += RED_SL) {
			float u[4];
			load4rw(J.part + (size_t)g * dim, e, dim, vec, u);
#pragma unroll
			for (int q = 0; q < 4; q++) a[q] = __fadd_rn(a[q], u[q]);
		}
	}
	sm[sl][ci] = make_float4(a[0], a[1], a[2], a[3]);
	__syncthreads();
	if (sl == 0 && e < dim) {
		float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
		for (int i = 0; i < RED_SL; i++) {
			const float4 v = sm[i][ci];
			o[0] = __fadd_rn(o[0], v.x);
			o[1] = __fadd_rn(o[1], v.y);
			o[2] = __fadd_rn(o[2], v.z);
			o[3] = __fadd_rn(o[3], v.w);
		}
		storeT<T_ANY>(J.dw, e, dim, vec, o, TYPE_DW(J));
	}
}

// Spins for ns nanoseconds (one thread). Benchmarks launch it before the
// timed work so that the launches are queued while the GPU is busy and the
// device events time the kernels, not the host's launch latency (the
// "blocking kernel" of nvbench).
#ifndef RMS_EMU
extern "C" __global__ void rms_bench_spin(long long ns) {
	unsigned long long t0, t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
	do {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	} while ((long long)(t - t0) < ns);
}
#endif

// c = a + b over n4 float4s: the device bandwidth ceiling the benchmarks
// compare with (12 bytes per element, as our kernels' minimal traffic).
extern "C" __global__ void rms_bench_add_f32(const float4* __restrict__ a, const float4* __restrict__ b,
                                             float4* __restrict__ c, long long n4) {
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
	     i += (long long)gridDim.x * blockDim.x) {
		const float4 u = a[i], v = b[i];
		c[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
	}
}

// Fills n elements of dtype dt at p with values in [lo, hi) from a hash of
// the index and seed: benchmark inputs made on the device, never zeros
// (cuda.TestBenchSweep).
extern "C" __global__ void rms_bench_fill(void* p, long long n, int dt, unsigned seed, float lo, float hi) {
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		unsigned h = ((unsigned)i * 0x9E3779B1u) ^ ((unsigned)(i >> 32) * 0x7FEB352Du) ^ seed;
		h ^= h >> 16;
		h *= 0x85EBCA6Bu;
		h ^= h >> 13;
		h *= 0xC2B2AE35u;
		h ^= h >> 16;
		const float v = lo + (hi - lo) * ((float)(h >> 8) * (1.0f / 16777216.0f));
		if (dt == T_F32)
			((float*)p)[i] = v;
		else
			((unsigned short*)p)[i] = dt == T_BF16 ? f2bf(v) : f2h(v);
	}
}
#endif
