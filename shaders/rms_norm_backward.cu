// RMSNorm backward for the cuda backend, compiled by NVRTC at start-up for the
// device's architecture (cuda/nvrtc.go). Self-contained: NVRTC sees no host
// headers.
//
// x is [rows, dim], w is [dim], dy is [rows, dim]:
//   r[b]    = 1 / sqrt(mean_i(x[b,i]^2) + eps)
//   s[b]    = sum_i dy[b,i] * x[b,i] * w[i]
//   dx[b,k] = r[b] * (dy[b,k]*w[k] - x[b,k] * (s[b] * r[b]^2 / dim))
//   dw[i]   = sum_b dy[b,i] * x[b,i] * r[b]
//
// One kernel, rms_norm_backward_rows_f32, runs every row-wise piece of work of
// a batch over a job table (one launch for many jobs: per-launch cost is what
// decides small-job throughput). Each job entry says what to do with flags:
// compute r (or read it), write r, write dx, write dw partials. The three
// kernels of compute (rms_norm_compute_rms_inv_f32, rms_norm_backward_dx_f32,
// rms_norm_backward_dw_f32) are flag sets of this one code path, so a job whose
// RMSInv, DX and DW the backend fuses into one pass gives the same bits as the
// three run apart: the arithmetic is the same instructions in the same order.
// Every float operation uses an explicit round-to-nearest intrinsic so the
// compiler cannot contract or reorder differently between variants.
//
// Determinism: the reduction order of a row depends only on dim (thread t owns
// 4-element chunks t, t+256, ...; each thread sums its chunks in order, then a
// fixed xor-butterfly per warp, then the 8 warp sums in order). dw partials
// are per row group ([G, dim], G and the group size a function of rows only,
// rows inside a group summed in order) and rms_norm_dw_reduce_f32 adds the G
// partials of each column in order. No float atomics anywhere, so dx and dw
// are bitwise identical across runs, batch compositions and recording orders.

#define RMS_THREADS 256
#define RMS_WARPS (RMS_THREADS / 32)
// Chunks (of 4 floats) per thread held in registers: dim <= 256*4*8 = 8192
// keeps the whole row of x and dy in registers, so x and dy are read once.
// Larger dims take the same arithmetic with re-reads from global memory.
#define RMS_KMAX 8

#define F_COMPUTE_R 1
#define F_WRITE_R 2
#define F_DX 4
#define F_DW 8

// Job is one entry of the job table; cuda/execute.go writes the same layout
// (jobEntry, 80 bytes).
struct Job {
	const float* x;
	const float* w;
	const float* dy;
	float* r;
	float* dx;
	float* part; // [g, dim] dw partials
	float* dw;
	int rows;
	int dim;
	int rg; // rows per group
	int g;  // groups = ceil(rows / rg)
	int flags;
	float eps;
};

__device__ __forceinline__ void load4(const float* p, int e, int dim, bool vec, float v[4]) {
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
		*reinterpret_cast<float4*>(p + e) = make_float4(v[0], v[1], v[2], v[3]);
	} else {
#pragma unroll
		for (int q = 0; q < 4; q++)
			if (e + q < dim) p[e + q] = v[q];
	}
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

// Accumulates one chunk's contributions to ss (sum x^2) and s (sum dy*x*w).
__device__ __forceinline__ void accum(const float xv[4], const float dv[4], const float wv[4], int e,
                                      int dim, bool doR, bool doS, float& ss, float& s) {
#pragma unroll
	for (int q = 0; q < 4; q++) {
		if (e + q < dim) {
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

extern "C" __global__ void __launch_bounds__(RMS_THREADS, 2)
    rms_norm_backward_rows_f32(const Job* __restrict__ jobs) {
	const Job J = jobs[blockIdx.y];
	const int grp = blockIdx.x;
	if (grp >= J.g) return;
	const int dim = J.dim;
	const int nch = (dim + 3) >> 2;
	const int K = (nch + RMS_THREADS - 1) / RMS_THREADS;
	const bool vec = (dim & 3) == 0;
	const bool regs = K <= RMS_KMAX;
	const bool doR = (J.flags & F_COMPUTE_R) != 0;
	const bool doDX = (J.flags & F_DX) != 0;
	const bool doDW = (J.flags & F_DW) != 0;
	const bool needDY = doDX || doDW;
	const int t = threadIdx.x;
	const int lane = t & 31, warp = t >> 5;
	__shared__ float red[2][2][RMS_WARPS];

	float dwacc[RMS_KMAX][4];
#pragma unroll
	for (int k = 0; k < RMS_KMAX; k++)
#pragma unroll
		for (int q = 0; q < 4; q++) dwacc[k][q] = 0.0f;

	const int b0 = grp * J.rg;
	const int b1 = min(b0 + J.rg, J.rows);
	float* part = J.part + (size_t)grp * dim;
	for (int b = b0; b < b1; b++) {
		const float* xr = J.x + (size_t)b * dim;
		const float* dyr = J.dy + (size_t)b * dim;
		const int p = b & 1;
		float ss = 0.0f, s = 0.0f;
		float xv[RMS_KMAX][4], dv[RMS_KMAX][4];
		if (regs) {
			// All loads of the row first, so they are in flight together.
#pragma unroll
			for (int k = 0; k < RMS_KMAX; k++) {
				const int c = t + k * RMS_THREADS;
				if (k < K && c < nch) {
					load4(xr, c * 4, dim, vec, xv[k]);
					if (needDY) load4(dyr, c * 4, dim, vec, dv[k]);
				}
			}
			if (doR || doDX) {
#pragma unroll
				for (int k = 0; k < RMS_KMAX; k++) {
					const int c = t + k * RMS_THREADS;
					if (k < K && c < nch) {
						float wv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
						if (doDX) load4(J.w, c * 4, dim, vec, wv);
						accum(xv[k], dv[k], wv, c * 4, dim, doR, doDX, ss, s);
					}
				}
			}
		} else {
			for (int c = t; c < nch; c += RMS_THREADS) {
				float x4[4], d4[4] = {0.0f, 0.0f, 0.0f, 0.0f}, w4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
				load4(xr, c * 4, dim, vec, x4);
				if (doDX) {
					load4(dyr, c * 4, dim, vec, d4);
					load4(J.w, c * 4, dim, vec, w4);
				}
				accum(x4, d4, w4, c * 4, dim, doR, doDX, ss, s);
			}
		}
		float r = 0.0f, cc = 0.0f;
		if (doR || doDX) {
			ss = warp_sum(ss);
			s = warp_sum(s);
			if (lane == 0) {
				red[p][0][warp] = ss;
				red[p][1][warp] = s;
			}
			__syncthreads();
			float tss = 0.0f, ts = 0.0f;
#pragma unroll
			for (int i = 0; i < RMS_WARPS; i++) {
				tss = __fadd_rn(tss, red[p][0][i]);
				ts = __fadd_rn(ts, red[p][1][i]);
			}
			ss = tss;
			s = ts;
		}
		if (doR) {
			r = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), J.eps)));
			if ((J.flags & F_WRITE_R) && t == 0) J.r[b] = r;
		} else if (needDY) {
			r = J.r[b];
		}
		if (doDX) cc = __fdiv_rn(__fmul_rn(__fmul_rn(s, r), r), (float)dim);
		if (!needDY) continue;
		if (regs) {
#pragma unroll
			for (int k = 0; k < RMS_KMAX; k++) {
				const int c = t + k * RMS_THREADS;
				if (k < K && c < nch) {
					if (doDX) {
						float wv[4], o[4];
						load4(J.w, c * 4, dim, vec, wv);
						dx4(xv[k], dv[k], wv, r, cc, o);
						store4(J.dx + (size_t)b * dim, c * 4, dim, vec, o);
					}
					if (doDW) {
#pragma unroll
						for (int q = 0; q < 4; q++)
							dwacc[k][q] = __fmaf_rn(__fmul_rn(dv[k][q], xv[k][q]), r, dwacc[k][q]);
					}
				}
			}
		} else {
			for (int c = t; c < nch; c += RMS_THREADS) {
				float x4[4], d4[4];
				load4(xr, c * 4, dim, vec, x4);
				load4(dyr, c * 4, dim, vec, d4);
				if (doDX) {
					float w4[4], o[4];
					load4(J.w, c * 4, dim, vec, w4);
					dx4(x4, d4, w4, r, cc, o);
					store4(J.dx + (size_t)b * dim, c * 4, dim, vec, o);
				}
				if (doDW) {
					// Same arithmetic as the register path, the accumulator
					// living in the group's partial row (only this thread
					// touches these columns of this group).
					float a[4], o[4];
					if (b == b0) {
						a[0] = a[1] = a[2] = a[3] = 0.0f;
					} else {
						load4(part, c * 4, dim, vec, a);
					}
#pragma unroll
					for (int q = 0; q < 4; q++) o[q] = __fmaf_rn(__fmul_rn(d4[q], x4[q]), r, a[q]);
					store4(part, c * 4, dim, vec, o);
				}
			}
		}
	}
	if (doDW && regs) {
#pragma unroll
		for (int k = 0; k < RMS_KMAX; k++) {
			const int c = t + k * RMS_THREADS;
			if (k < K && c < nch) store4(part, c * 4, dim, vec, dwacc[k]);
		}
	}
}

// dw[i] = sum over groups g, in order, of part[g, i]. grid: (ceil(dim/256),
// jobs); entries without F_DW are skipped.
extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    rms_norm_dw_reduce_f32(const Job* __restrict__ jobs) {
	const Job J = jobs[blockIdx.y];
	if (!(J.flags & F_DW)) return;
	const int i = blockIdx.x * RMS_THREADS + threadIdx.x;
	if (i >= J.dim) return;
	const float* p = J.part + i;
	float acc = 0.0f;
	int g = 0;
	// Four loads in flight per step; the adds stay in group order.
	for (; g + 4 <= J.g; g += 4) {
		const float a0 = p[(size_t)(g + 0) * J.dim], a1 = p[(size_t)(g + 1) * J.dim];
		const float a2 = p[(size_t)(g + 2) * J.dim], a3 = p[(size_t)(g + 3) * J.dim];
		acc = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(acc, a0), a1), a2), a3);
	}
	for (; g < J.g; g++) acc = __fadd_rn(acc, p[(size_t)g * J.dim]);
	J.dw[i] = acc;
}

// c = a + b over n floats (n a multiple of 4): the device copy ceiling the
// benchmarks compare with (same bytes per element as our traffic shape).
extern "C" __global__ void rms_bench_add_f32(const float4* __restrict__ a, const float4* __restrict__ b,
                                             float4* __restrict__ c, long long n4) {
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
	     i += (long long)gridDim.x * blockDim.x) {
		const float4 u = a[i], v = b[i];
		c[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
	}
}
