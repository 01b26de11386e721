// Runs the device code of cuda/variants/rows.cu (the kernel-geometry
// harness) on the CPU, for cuda.TestVariantsOnCPU: each launch's blocks in
// turn, one fiber per CUDA thread (../testdata/emu_shim.h), real barriers for __syncthreads
// and the warp shuffles, CUDA's round-to-nearest intrinsics as IEEE float
// operations. The asynchronous copies of fusedA (cp.async) are emulated in
// two ways, run one after the other: eager (the copy lands when issued:
// catches a slot overwritten while a thread still reads it) and late (the
// copies of a group land only when cp_wait lets them: catches a slot read
// before its copy was waited for). Each fusedA variant must give the bits
// of fused (body: rows in registers) at the same block size and chunk
// width, dx and the dw partials alike, and both must agree with a double
// reference. Exit status 1 on any failure.
#include "../testdata/emu_shim.h"

#define ROWS_EMU 1
// bf16_rne rounds to bfloat16 with round-to-nearest-even (cvt.rn.bf16x2;
// the harness's inputs and outputs are finite).
inline unsigned bf16_rne(float f) {
	unsigned u;
	std::memcpy(&u, &f, 4);
	return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
alignas(16) float4 dsm[232448 / 16];
// cp.async (emu_shim.h): eager or late, as main sets g_eager.
inline void cp16(void* s, const void* g) { emu_cp16(s, g); }
inline void cp_commit() { emu_cp_commit(); }
template <int N>
inline void cp_wait() {
	emu_cp_wait(N);
}
#include "rows.cu"

typedef unsigned short B;
static int failures;

template <typename E>
struct Case {
	int rows, dim, g;
	std::vector<E> x, dy;
	std::vector<float> w;
	std::vector<double> xf, dyf; // the inputs as the kernels see them
	Case(int rows_, int dim_, int g_) : rows(rows_), dim(dim_), g(g_) {
		const size_t n = (size_t)rows * dim;
		x.resize(n), dy.resize(n), w.resize(dim), xf.resize(n), dyf.resize(n);
		unsigned long long st = 0x9e3779b97f4a7c15ull ^ (n * 31 + dim);
		auto rnd = [&] {
			st ^= st << 13, st ^= st >> 7, st ^= st << 17;
			return (float)((st >> 11) * (1.0 / 9007199254740992.0) * 2 - 1);
		};
		for (size_t i = 0; i < n; i++) {
			put(x[i], xf[i], rnd());
			put(dy[i], dyf[i], rnd());
		}
		for (auto& v : w) v = 0.5f + rnd();
	}
	static void put(float& e, double& f, float v) { e = v, f = v; }
	static void put(B& e, double& f, float v) {
		e = (B)bf16_rne(v);
		f = __uint_as_float((unsigned)e << 16);
	}
	static double get(float e) { return e; }
	static double get(B e) { return __uint_as_float((unsigned)e << 16); }
};

// Out: dx as the kernel wrote it and the dw partials.
template <typename E>
struct Out {
	std::vector<E> dx;
	std::vector<float> part;
};

template <typename E>
static Out<E> runKernel(const Case<E>& C, int T, const std::function<void(E*, float*)>& k) {
	Out<E> o;
	o.dx.assign((size_t)C.rows * C.dim, (E)0x7fc0);
	o.part.assign((size_t)C.g * C.dim, NAN);
	std::memset(dsm, 0xff, sizeof dsm); // stale slots are not zeros
	launch(C.g, T, [&] { k(o.dx.data(), o.part.data()); });
	if (g_leak) {
		std::printf("FAIL: a thread ended a block with copies not waited for\n");
		std::exit(1);
	}
	return o;
}

// near checks dx and dw (the partials summed) against the double reference:
// |got - ref| within tol of the largest |ref| of the row (of dw).
template <typename E>
static bool near(const Case<E>& C, const Out<E>& o, double tol, const char* name) {
	std::vector<double> dw(C.dim, 0.0);
	double worst = 0;
	for (int b = 0; b < C.rows; b++) {
		const double* xr = &C.xf[(size_t)b * C.dim];
		const double* dr = &C.dyf[(size_t)b * C.dim];
		double ss = 0, s = 0;
		for (int i = 0; i < C.dim; i++) ss += xr[i] * xr[i], s += dr[i] * xr[i] * C.w[i];
		const double r = 1 / std::sqrt(ss / C.dim + 1e-5);
		std::vector<double> ref(C.dim);
		double m = 0;
		for (int i = 0; i < C.dim; i++) {
			ref[i] = r * (dr[i] * C.w[i] - xr[i] * (s * r * r / C.dim));
			m = std::max(m, std::fabs(ref[i]));
			dw[i] += dr[i] * xr[i] * r;
		}
		for (int i = 0; i < C.dim; i++)
			worst = std::max(worst, std::fabs(Case<E>::get(o.dx[(size_t)b * C.dim + i]) - ref[i]) / m);
	}
	double mw = 0;
	for (double v : dw) mw = std::max(mw, std::fabs(v));
	for (int i = 0; i < C.dim; i++) {
		double got = 0;
		for (int q = 0; q < C.g; q++) got += o.part[(size_t)q * C.dim + i];
		worst = std::max(worst, std::fabs(got - dw[i]) / mw);
	}
	if (!(worst < tol)) {
		std::printf("FAIL %s: error %.3g against the double reference (tolerance %.3g)\n", name, worst, tol);
		failures++;
		return false;
	}
	return true;
}

template <typename E>
static bool sameBits(const Out<E>& a, const Out<E>& b) {
	return std::memcmp(a.dx.data(), b.dx.data(), a.dx.size() * sizeof(E)) == 0 &&
	       std::memcmp(a.part.data(), b.part.data(), a.part.size() * sizeof(float)) == 0;
}

// check runs fusedA<E,T,K,V,P,R,WS> (eager and late copies) and
// fused<E,T,K,V,2,1> on rows x dim in g groups.
template <typename E, int T, int K, int V, int P, int R, bool WS>
static void check(int rows, int dim, int g) {
	Case<E> C(rows, dim, g);
	const double tol = sizeof(E) == 2 ? 1e-2 : 1e-5;
	char name[128];
	std::snprintf(name, sizeof name, "%s T%d K%d V%d P%d R%d%s, %dx%d in %d groups", sizeof(E) == 2 ? "bf16" : "f32", T, K, V,
	              P, R, WS ? " WS" : "", rows, dim, g);
	auto ref = runKernel<E>(C, T, [&](E* dx, float* part) {
		fused<E, T, K, V, 2, 1, false, 1>(C.x.data(), C.w.data(), C.dy.data(), dx, part, rows, dim, 1e-5f);
	});
	bool ok = near(C, ref, tol, name);
	for (int eager = 1; eager >= 0; eager--) {
		g_eager = eager;
		auto got = runKernel<E>(C, T, [&](E* dx, float* part) {
			fusedA<E, T, K, V, P, R, WS, 1>(C.x.data(), C.w.data(), C.dy.data(), dx, part, rows, dim, 1e-5f);
		});
		if (!sameBits(got, ref)) {
			std::printf("FAIL %s, %s copies: not the bits of the register rows\n", name, eager ? "eager" : "late");
			failures++;
			ok = false;
		}
	}
	std::printf("%s %s\n", ok ? "ok  " : "FAIL", name);
	std::fflush(stdout);
}

int main() {
	// The geometries of the harness's fusedA set, at dims they cover (whole
	// and partial rows of chunks), groups of 7-8 rows (R=2 with an odd
	// count), one group of many rows (every slot reused many times) and
	// groups with fewer rows than slots.
	check<B, 128, 4, 8, 3, 1, false>(37, 4096, 5);
	check<B, 128, 4, 8, 4, 2, false>(37, 4000, 5);
	check<B, 128, 4, 8, 2, 1, false>(29, 4096, 1);
	check<B, 256, 2, 8, 3, 1, false>(37, 4096, 5);
	check<B, 256, 2, 8, 4, 2, false>(23, 3968, 1);
	check<B, 256, 4, 8, 3, 1, false>(9, 8192, 3);
	check<B, 512, 2, 8, 3, 1, false>(9, 8192, 3);
	check<B, 512, 1, 8, 3, 1, false>(5, 4096, 4);
	check<B, 256, 1, 8, 4, 2, false>(40, 2048, 6);
	check<B, 128, 2, 8, 4, 1, false>(7, 2048, 7);
	check<B, 128, 4, 8, 4, 2, true>(37, 4096, 5);
	check<float, 64, 2, 4, 3, 1, false>(37, 512, 5);
	check<float, 64, 2, 4, 4, 2, true>(37, 496, 3);
	check<float, 96, 3, 4, 4, 3, false>(50, 1152, 2);
	if (failures) {
		std::printf("%d failures\n", failures);
		return 1;
	}
	return 0;
}
