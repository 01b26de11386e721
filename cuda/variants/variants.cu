// Kernel-geometry experiments for the cuda backend's fused rows pass
// (rms_inv + dx + dw partials), built with nvcc on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o /tmp/variants cuda/variants/variants.cu && /tmp/variants
// Not part of the backend: it times candidate block sizes, register
// prefetch depths and the dw partial reduction against a device copy and a
// c = a + b kernel of the same bytes, so that the backend's shader
// (shaders/rms_norm_backward.cu) takes the geometry that measured best.
// Every variant is checked against a float64 reference.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
namespace cg = cooperative_groups;

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#define CK(x)                                                                              \
	do {                                                                                   \
		cudaError_t e_ = (x);                                                              \
		if (e_ != cudaSuccess) {                                                           \
			printf("CUDA %s at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_));      \
			exit(1);                                                                       \
		}                                                                                  \
	} while (0)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

// T threads, K float4 chunks per thread (chunk c = t + k*T), PF rows
// prefetched into registers, MINB blocks per SM asked of the compiler.
// w is held in registers (the block works on the same columns every row).
template <int T, int K, int PF, int TRIG>
__device__ __forceinline__ void fused_body(const float4* __restrict__ x, const float4* __restrict__ w, const float4* __restrict__ dy,
                                           float4* __restrict__ dx, float4* __restrict__ part, int rows, int nch, int rg, float eps,
                                           float fdim) {
	constexpr int W = T / 32;
	__shared__ float red[2][2][32];
	const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
	// TRIG bit 1: rows interleaved across blocks (block i takes rows i,
	// i+G, ...: the grid sweeps the tensor together, as c = a + b does);
	// b counts the block's rows and rowOf maps it to the tensor's.
	constexpr bool IL = (TRIG & 2) != 0;
	const int G = gridDim.x;
	const int b0 = IL ? 0 : blockIdx.x * rg, b1 = IL ? (rows - (int)blockIdx.x + G - 1) / G : min(b0 + rg, rows);
	auto rowOf = [&](int b) { return IL ? (int)blockIdx.x + b * G : b; };
	float4 wv[K], acc[K], xs[PF + 1][K], ds[PF + 1][K];
#pragma unroll
	for (int k = 0; k < K; k++) {
		const int c = t + k * T;
		wv[k] = c < nch ? __ldg(w + c) : make_float4(0, 0, 0, 0);
		acc[k] = make_float4(0, 0, 0, 0);
	}
	auto load = [&](int s, int b) {
		if (b < b1) {
#pragma unroll
			for (int k = 0; k < K; k++) {
				const int c = t + k * T;
				if (c < nch) {
					xs[s][k] = __ldg(x + (size_t)rowOf(b) * nch + c);
					ds[s][k] = __ldg(dy + (size_t)rowOf(b) * nch + c);
				}
			}
		}
	};
#pragma unroll
	for (int s = 0; s <= PF; s++) load(s, b0 + s);
	if (TRIG & 1) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	for (int bb = b0; bb < b1; bb += PF + 1) {
#pragma unroll
		for (int s = 0; s <= PF; s++) {
			const int b = bb + s;
			if (b < b1) {
				float ss = 0.0f, sd = 0.0f;
#pragma unroll
				for (int k = 0; k < K; k++) {
					const int c = t + k * T;
					if (c < nch) {
						const float4 a = xs[s][k], d = ds[s][k], ww = wv[k];
						ss = __fmaf_rn(a.x, a.x, ss);
						ss = __fmaf_rn(a.y, a.y, ss);
						ss = __fmaf_rn(a.z, a.z, ss);
						ss = __fmaf_rn(a.w, a.w, ss);
						sd = __fmaf_rn(__fmul_rn(d.x, a.x), ww.x, sd);
						sd = __fmaf_rn(__fmul_rn(d.y, a.y), ww.y, sd);
						sd = __fmaf_rn(__fmul_rn(d.z, a.z), ww.z, sd);
						sd = __fmaf_rn(__fmul_rn(d.w, a.w), ww.w, sd);
					}
				}
				ss = warp_sum(ss);
				sd = warp_sum(sd);
				const int p = b & 1;
				if (lane == 0) {
					red[p][0][warp] = ss;
					red[p][1][warp] = sd;
				}
				__syncthreads();
				const float tss = warp_sum(lane < W ? red[p][0][lane] : 0.0f);
				const float ts = warp_sum(lane < W ? red[p][1][lane] : 0.0f);
				const float r = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(tss, fdim), eps)));
				const float cc = __fdiv_rn(__fmul_rn(__fmul_rn(ts, r), r), fdim);
#pragma unroll
				for (int k = 0; k < K; k++) {
					const int c = t + k * T;
					if (c < nch) {
						const float4 a = xs[s][k], d = ds[s][k], ww = wv[k];
						float4 o;
						o.x = __fmul_rn(r, __fmaf_rn(-a.x, cc, __fmul_rn(d.x, ww.x)));
						o.y = __fmul_rn(r, __fmaf_rn(-a.y, cc, __fmul_rn(d.y, ww.y)));
						o.z = __fmul_rn(r, __fmaf_rn(-a.z, cc, __fmul_rn(d.z, ww.z)));
						o.w = __fmul_rn(r, __fmaf_rn(-a.w, cc, __fmul_rn(d.w, ww.w)));
						dx[(size_t)rowOf(b) * nch + c] = o;
						acc[k].x = __fmaf_rn(__fmul_rn(d.x, a.x), r, acc[k].x);
						acc[k].y = __fmaf_rn(__fmul_rn(d.y, a.y), r, acc[k].y);
						acc[k].z = __fmaf_rn(__fmul_rn(d.z, a.z), r, acc[k].z);
						acc[k].w = __fmaf_rn(__fmul_rn(d.w, a.w), r, acc[k].w);
					}
				}
				load(s, b + PF + 1);
			}
		}
	}
#pragma unroll
	for (int k = 0; k < K; k++) {
		const int c = t + k * T;
		if (c < nch) part[(size_t)blockIdx.x * nch + c] = acc[k];
	}
}

template <int T, int K, int PF, int MINB>
__global__ void __launch_bounds__(T, MINB)
    fused(const float4* __restrict__ x, const float4* __restrict__ w, const float4* __restrict__ dy,
          float4* __restrict__ dx, float4* __restrict__ part, int rows, int nch, int rg, float eps, float fdim) {
	fused_body<T, K, PF, 0>(x, w, dy, dx, part, rows, nch, rg, eps, fdim);
}

// The same, telling a programmatically dependent launch (the reduce) that
// it may start once every block has issued its first loads.
template <int T, int K, int PF, int MINB>
__global__ void __launch_bounds__(T, MINB)
    fused_trig(const float4* __restrict__ x, const float4* __restrict__ w, const float4* __restrict__ dy,
               float4* __restrict__ dx, float4* __restrict__ part, int rows, int nch, int rg, float eps, float fdim) {
	fused_body<T, K, PF, 1>(x, w, dy, dx, part, rows, nch, rg, eps, fdim);
}

template <int T, int K, int PF, int MINB>
__global__ void __launch_bounds__(T, MINB)
    fused_il(const float4* __restrict__ x, const float4* __restrict__ w, const float4* __restrict__ dy,
             float4* __restrict__ dx, float4* __restrict__ part, int rows, int nch, int rg, float eps, float fdim) {
	fused_body<T, K, PF, 2>(x, w, dy, dx, part, rows, nch, rg, eps, fdim);
}

// Rows, then a grid barrier, then dw in the same launch (cooperative): block
// b sums columns b, b+G, ...; a warp per column, lane l sums partials
// l, l+32, ... in order, then a butterfly: a fixed order for a fixed G.
template <int T, int K, int PF, int MINB>
__global__ void __launch_bounds__(T, MINB)
    fused_coop(const float4* __restrict__ x, const float4* __restrict__ w, const float4* __restrict__ dy,
               float4* __restrict__ dx, float4* __restrict__ part, float4* __restrict__ dw, int rows, int nch, int rg,
               float eps, float fdim) {
	fused_body<T, K, PF, 0>(x, w, dy, dx, part, rows, nch, rg, eps, fdim);
	cg::this_grid().sync();
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, G = gridDim.x;
	for (int c = blockIdx.x + warp * G; c < nch; c += G * (T / 32)) {
		float4 a = make_float4(0, 0, 0, 0);
		for (int i = lane; i < G; i += 32) {
			const float4 u = __ldcg(part + (size_t)i * nch + c);
			a.x = __fadd_rn(a.x, u.x);
			a.y = __fadd_rn(a.y, u.y);
			a.z = __fadd_rn(a.z, u.z);
			a.w = __fadd_rn(a.w, u.w);
		}
		a.x = warp_sum(a.x);
		a.y = warp_sum(a.y);
		a.z = warp_sum(a.z);
		a.w = warp_sum(a.w);
		if (lane == 0) dw[c] = a;
	}
}

// dw[c] = sum over g of part[g, c]: block of 256 = 8 float4 columns x 32
// slices; slice s sums g = s, s+32, ... in order, then slices in order.
template <int WAIT>
__global__ void __launch_bounds__(256) reduce_t(const float4* __restrict__ part, float4* __restrict__ dw, int g, int nch) {
	if (WAIT) asm volatile("griddepcontrol.wait;" ::: "memory");
	__shared__ float4 sm[32][8];
	const int ci = threadIdx.x & 7, sl = threadIdx.x >> 3;
	const int c = blockIdx.x * 8 + ci;
	float4 a = make_float4(0, 0, 0, 0);
	if (c < nch) {
		for (int i = sl; i < g; i += 32) {
			const float4 u = part[(size_t)i * nch + c];
			a.x = __fadd_rn(a.x, u.x);
			a.y = __fadd_rn(a.y, u.y);
			a.z = __fadd_rn(a.z, u.z);
			a.w = __fadd_rn(a.w, u.w);
		}
	}
	sm[sl][ci] = a;
	__syncthreads();
	if (sl == 0 && c < nch) {
		float4 o = make_float4(0, 0, 0, 0);
		for (int i = 0; i < 32; i++) {
			o.x = __fadd_rn(o.x, sm[i][ci].x);
			o.y = __fadd_rn(o.y, sm[i][ci].y);
			o.z = __fadd_rn(o.z, sm[i][ci].z);
			o.w = __fadd_rn(o.w, sm[i][ci].w);
		}
		dw[c] = o;
	}
}
#define reduce reduce_t<0>

__global__ void add(const float4* __restrict__ a, const float4* __restrict__ b, float4* __restrict__ c, long long n4) {
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
		const float4 u = a[i], v = b[i];
		c[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
	}
}

static float median(std::vector<float> v) {
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

static float timeit(const std::function<void()>& f, int reps = 25) {
	cudaEvent_t a, b;
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	std::vector<float> ts;
	for (int i = 0; i < reps + 3; i++) {
		CK(cudaEventRecord(a));
		f();
		CK(cudaEventRecord(b));
		CK(cudaEventSynchronize(b));
		float ms;
		CK(cudaEventElapsedTime(&ms, a, b));
		if (i >= 3) ts.push_back(ms * 1000);
	}
	CK(cudaGetLastError());
	return median(ts);
}

struct Shape {
	int rows, dim;
	float4 *x, *w, *dy, *dx, *part, *dw;
	std::vector<double> refdx, refdw; // a sample of rows of dx, all of dw
	float copy_us, add_us;
	long long bytes;
};

static int sms;
static const int sample_rows[] = {0, 1, 17, 1000, 4095};

template <int T, int K, int PF, int MINB>
static void run(Shape& S, const char* name, int bps) {
	const int nch = S.dim / 4;
	if (nch > T * K) return;
	auto kern = fused<T, K, PF, MINB>;
	int occ = 0;
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, T, 0));
	if (bps > occ) {
		printf("%-8dx%-6d %-28s bps=%d  skipped: occupancy only %d\n", S.rows, S.dim, name, bps, occ);
		return;
	}
	cudaFuncAttributes fa;
	CK(cudaFuncGetAttributes(&fa, kern));
	const int gmax = bps * sms;
	int rg = (S.rows + gmax - 1) / gmax;
	int g = (S.rows + rg - 1) / rg;
	const float eps = 1e-5f;
	auto rows_only = [&] { kern<<<g, T>>>(S.x, S.w, S.dy, S.dx, S.part, S.rows, nch, rg, eps, (float)S.dim); };
	auto both = [&] {
		rows_only();
		reduce<<<(nch + 7) / 8, 256>>>(S.part, S.dw, g, nch);
	};
	float tr = timeit(rows_only), tb = timeit(both);
	// check
	std::vector<float> dw(S.dim), row(S.dim);
	CK(cudaMemcpy(dw.data(), S.dw, 4 * S.dim, cudaMemcpyDeviceToHost));
	double err = 0;
	for (int i = 0; i < S.dim; i++) err = std::max(err, std::fabs(dw[i] - S.refdw[i]) / (1e-3 + std::fabs(S.refdw[i])));
	int si = 0;
	for (int b : sample_rows) {
		if (b >= S.rows) continue;
		CK(cudaMemcpy(row.data(), (float*)S.dx + (size_t)b * S.dim, 4 * S.dim, cudaMemcpyDeviceToHost));
		for (int i = 0; i < S.dim; i++)
			err = std::max(err, std::fabs(row[i] - S.refdx[(size_t)si * S.dim + i]) / (1e-3 + std::fabs(S.refdx[(size_t)si * S.dim + i])));
		si++;
	}
	printf("%-8dx%-6d %-28s bps=%d regs=%3d spill=%3d g=%4d rg=%4d  rows %7.1f us (%5.1f%% copy)  rows+reduce %7.1f us (%5.1f%% copy, %5.1f%% add)  err %.1e %s\n",
	       S.rows, S.dim, name, bps, fa.numRegs, (int)fa.localSizeBytes, g, rg, tr, 100 * S.copy_us / tr, tb,
	       100 * S.copy_us / tb, 100 * S.add_us / tb, err, err < 1e-3 ? "ok" : "WRONG");
}

static double check(Shape& S) {
	std::vector<float> dw(S.dim), row(S.dim);
	CK(cudaMemcpy(dw.data(), S.dw, 4 * S.dim, cudaMemcpyDeviceToHost));
	double err = 0;
	for (int i = 0; i < S.dim; i++) err = std::max(err, std::fabs(dw[i] - S.refdw[i]) / (1e-2 + std::fabs(S.refdw[i])));
	int si = 0;
	for (int b : sample_rows) {
		if (b >= S.rows) continue;
		CK(cudaMemcpy(row.data(), (float*)S.dx + (size_t)b * S.dim, 4 * S.dim, cudaMemcpyDeviceToHost));
		for (int i = 0; i < S.dim; i++)
			err = std::max(err, std::fabs(row[i] - S.refdx[(size_t)si * S.dim + i]) / (1e-3 + std::fabs(S.refdx[(size_t)si * S.dim + i])));
		si++;
	}
	return err;
}

// The dw tail: the two-launch baseline against programmatic dependent
// launch of the reduce (with and without an early trigger in the rows
// kernel) and a cooperative rows + grid barrier + reduce kernel; gsel picks
// the grid (0: rows/ceil(rows/(bps*SMs)) as the backend; else that many).
template <int T, int K, int PF, int MINB>
static void tail(Shape& S, const char* name, int bps, int gfix) {
	const int nch = S.dim / 4;
	const int gmax = gfix ? gfix : bps * sms;
	int rg = (S.rows + gmax - 1) / gmax;
	int g = (S.rows + rg - 1) / rg;
	const float eps = 1e-5f;
	const float fdim = (float)S.dim;
	int rows = S.rows;
	auto k0 = fused<T, K, PF, MINB>;
	auto kt = fused_trig<T, K, PF, MINB>;
	auto kc = fused_coop<T, K, PF, MINB>;
	auto rows_only = [&] { k0<<<g, T>>>(S.x, S.w, S.dy, S.dx, S.part, rows, nch, rg, eps, fdim); };
	auto base = [&] {
		rows_only();
		reduce_t<0><<<(nch + 7) / 8, 256>>>(S.part, S.dw, g, nch);
	};
	// The reduce as a programmatic dependent launch of the kernel before it.
	auto reduce_pdl = [&] {
		cudaLaunchConfig_t cfg = {};
		cfg.gridDim = dim3((nch + 7) / 8);
		cfg.blockDim = dim3(256);
		cudaLaunchAttribute at[1];
		at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		at[0].val.programmaticStreamSerializationAllowed = 1;
		cfg.attrs = at;
		cfg.numAttrs = 1;
		CK(cudaLaunchKernelEx(&cfg, reduce_t<1>, (const float4*)S.part, S.dw, g, nch));
	};
	auto pdl = [&](bool trig) {
		if (trig)
			kt<<<g, T>>>(S.x, S.w, S.dy, S.dx, S.part, rows, nch, rg, eps, fdim);
		else
			rows_only();
		reduce_pdl();
	};
	auto coop = [&] {
		const float4 *x = S.x, *w = S.w, *dy = S.dy;
		float4 *dx = S.dx, *part = S.part, *dw = S.dw;
		void* args[] = {&x, &w, &dy, &dx, &part, &dw, &rows, (void*)&nch, &rg, (void*)&eps, (void*)&fdim};
		CK(cudaLaunchCooperativeKernel((void*)kc, g, T, args, 0, 0));
	};
	auto kil = fused_il<T, K, PF, MINB>;
	auto il_only = [&] { kil<<<g, T>>>(S.x, S.w, S.dy, S.dx, S.part, rows, nch, rg, eps, fdim); };
	auto il_pdl = [&] {
		il_only();
		reduce_pdl();
	};
	const float til = timeit(il_only);
	CK(cudaMemset(S.dw, 0, 4 * S.dim));
	const float tilp = timeit(il_pdl);
	const double eil = check(S);
	const float tr = timeit(rows_only);
	CK(cudaMemset(S.dw, 0, 4 * S.dim));
	const float tb = timeit(base);
	const double eb = check(S);
	CK(cudaMemset(S.dw, 0, 4 * S.dim));
	const float tp = timeit([&] { pdl(false); });
	const double ep = check(S);
	CK(cudaMemset(S.dw, 0, 4 * S.dim));
	const float tt = timeit([&] { pdl(true); });
	const double et = check(S);
	CK(cudaMemset(S.dw, 0, 4 * S.dim));
	int occ = 0;
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kc, T, 0));
	float tc = -1;
	double ec = -1;
	if (g <= occ * sms) {
		tc = timeit(coop);
		ec = check(S);
	}
	auto pc = [&](float t) { return t > 0 ? 100 * S.copy_us / t : 0.0f; };
	printf("%-6dx%-5d %-16s interleaved: rows %6.1f (%4.1f%%)  +pdl reduce %6.1f (%4.1f%%, err %.0e)\n", S.rows, S.dim, name, til, pc(til), tilp,
	       pc(tilp), eil);
	printf("%-6dx%-5d %-16s g=%4d rg=%4d  rows %6.1f (%4.1f%%)  2-launch %6.1f (%4.1f%%, err %.0e)  pdl %6.1f (%4.1f%%, %.0e)  "
	       "pdl+trig %6.1f (%4.1f%%, %.0e)  coop %6.1f (%4.1f%%, %.0e, occ %d)\n",
	       S.rows, S.dim, name, g, rg, tr, pc(tr), tb, pc(tb), eb, tp, pc(tp), ep, tt, pc(tt), et, tc, pc(tc), ec, occ);
}

static void setup(Shape& S) {
	const size_t n = (size_t)S.rows * S.dim;
	std::vector<float> hx(n), hdy(n), hw(S.dim);
	unsigned long long st = 0x9e3779b97f4a7c15ull ^ (n * 31 + S.dim);
	auto rnd = [&] {
		st ^= st << 13;
		st ^= st >> 7;
		st ^= st << 17;
		return (float)((st >> 11) * (1.0 / 9007199254740992.0) * 2 - 1);
	};
	for (auto& v : hx) v = rnd();
	for (auto& v : hdy) v = rnd();
	for (auto& v : hw) v = 0.5f + rnd();
	CK(cudaMalloc(&S.x, 4 * n));
	CK(cudaMalloc(&S.dy, 4 * n));
	CK(cudaMalloc(&S.dx, 4 * n));
	CK(cudaMalloc(&S.w, 4 * S.dim));
	CK(cudaMalloc(&S.dw, 4 * S.dim));
	CK(cudaMalloc(&S.part, 4 * (size_t)8 * sms * S.dim));
	CK(cudaMemcpy(S.x, hx.data(), 4 * n, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(S.dy, hdy.data(), 4 * n, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(S.w, hw.data(), 4 * S.dim, cudaMemcpyHostToDevice));
	S.refdw.assign(S.dim, 0);
	for (int b = 0; b < S.rows; b++) {
		const float* xr = &hx[(size_t)b * S.dim];
		const float* dr = &hdy[(size_t)b * S.dim];
		double ss = 0, s = 0;
		for (int i = 0; i < S.dim; i++) {
			ss += (double)xr[i] * xr[i];
			s += (double)dr[i] * xr[i] * hw[i];
		}
		double r = 1 / std::sqrt(ss / S.dim + 1e-5);
		for (int i = 0; i < S.dim; i++) S.refdw[i] += (double)dr[i] * xr[i] * r;
		for (int sr : sample_rows)
			if (sr == b)
				for (int i = 0; i < S.dim; i++) S.refdx.push_back(r * (dr[i] * (double)hw[i] - xr[i] * (s * r * r / S.dim)));
	}
	S.bytes = 12LL * n + 8LL * S.dim;
	float4 *a, *b, *c;
	const size_t abytes = std::max<size_t>(4 * n, S.bytes / 2) + 16;
	CK(cudaMalloc(&a, abytes));
	CK(cudaMalloc(&b, abytes));
	CK(cudaMalloc(&c, abytes));
	S.copy_us = timeit([&] { CK(cudaMemcpyAsync(a, b, S.bytes / 2, cudaMemcpyDeviceToDevice)); });
	const long long n4 = n / 4;
	S.add_us = timeit([&] { add<<<(int)std::min<long long>(n4 / 256 + 1, 32LL * sms), 256>>>(a, b, c, n4); });
	CK(cudaFree(a));
	CK(cudaFree(b));
	CK(cudaFree(c));
	printf("%dx%d: %lld bytes; copy %.1f us (%.0f GB/s), add %.1f us (%.1f%% of copy)\n", S.rows, S.dim, S.bytes,
	       S.copy_us, S.bytes / S.copy_us / 1e3, S.add_us, 100 * S.copy_us / S.add_us);
}

static void release(Shape& S) {
	cudaFree(S.x);
	cudaFree(S.dy);
	cudaFree(S.dx);
	cudaFree(S.w);
	cudaFree(S.dw);
	cudaFree(S.part);
}

int main(int argc, char** argv) {
	cudaDeviceProp p;
	CK(cudaGetDeviceProperties(&p, 0));
	sms = p.multiProcessorCount;
	printf("%s, %d SMs, L2 %d MB\n", p.name, sms, p.l2CacheSize >> 20);
	if (argc > 1 && std::string(argv[1]) == "tail") {
		int tshapes[][2] = {{16384, 4096}, {4096, 4096}, {32768, 8192}};
		for (int rep = 0; rep < 2; rep++)
			for (auto& sh : tshapes) {
				Shape S{sh[0], sh[1]};
				setup(S);
				if (S.dim == 4096) {
					tail<256, 4, 1, 2>(S, "T256 K4 PF1", 2, 0);
					tail<256, 4, 1, 2>(S, "T256 K4 PF1 g256", 2, 256);
					tail<512, 2, 1, 2>(S, "T512 K2 PF1", 2, 0);
				} else {
					tail<512, 4, 1, 1>(S, "T512 K4 PF1 mb1", 1, 0);
				}
				release(S);
			}
		return 0;
	}
	int shapes[][2] = {{16384, 4096}, {4096, 4096}, {32768, 8192}, {16384, 5120}};
	for (auto& sh : shapes) {
		Shape S{sh[0], sh[1]};
		setup(S);
		if (S.dim == 4096) {
			run<256, 4, 1, 2>(S, "T256 K4 PF1", 2);
			run<256, 4, 1, 2>(S, "T256 K4 PF1", 3);
			run<256, 4, 0, 4>(S, "T256 K4 PF0 mb4", 4);
			run<512, 2, 0, 4>(S, "T512 K2 PF0 mb4", 4);
			run<256, 4, 2, 1>(S, "T256 K4 PF2", 2);
			run<512, 2, 1, 2>(S, "T512 K2 PF1", 2);
			run<512, 2, 1, 2>(S, "T512 K2 PF1", 3);
			run<512, 2, 1, 4>(S, "T512 K2 PF1 mb4", 4);
			run<512, 2, 2, 2>(S, "T512 K2 PF2", 2);
			run<512, 2, 3, 2>(S, "T512 K2 PF3", 2);
			run<1024, 1, 1, 1>(S, "T1024 K1 PF1", 1);
			run<1024, 1, 1, 2>(S, "T1024 K1 PF1 mb2", 2);
			run<1024, 1, 2, 1>(S, "T1024 K1 PF2", 1);
			run<1024, 1, 3, 1>(S, "T1024 K1 PF3", 1);
			run<1024, 1, 2, 2>(S, "T1024 K1 PF2 mb2", 2);
		} else if (S.dim == 8192) {
			run<512, 4, 1, 2>(S, "T512 K4 PF1", 2);
			run<512, 4, 1, 1>(S, "T512 K4 PF1 mb1", 1);
			run<1024, 2, 1, 1>(S, "T1024 K2 PF1", 1);
			run<1024, 2, 1, 2>(S, "T1024 K2 PF1 mb2", 2);
			run<1024, 2, 2, 1>(S, "T1024 K2 PF2", 1);
			run<1024, 2, 3, 1>(S, "T1024 K2 PF3", 1);
		} else if (S.dim == 5120) {
			run<640, 2, 1, 2>(S, "T640 K2 PF1", 2);
			run<640, 2, 2, 1>(S, "T640 K2 PF2", 1);
			run<320, 4, 1, 2>(S, "T320 K4 PF1", 2);
			run<320, 4, 1, 3>(S, "T320 K4 PF1 mb3", 3);
			run<1024, 2, 1, 1>(S, "T1024 K2 PF1 (partial)", 1);
		}
		release(S);
	}
	return 0;
}
