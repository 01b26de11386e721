// Kernels with planted synchronisation bugs, for cuda.TestEmuCatchesBugs:
// the fiber shim (emu_shim.h) must end "divergent" and "deadlock" with
// exit status 2 and a message, and print different outputs for "race" in
// its two schedule orders (RMS_EMU_ORDER), while "synced", the same kernel
// with its barrier, prints the same in both.
#include <string>
#include "emu_shim.h"

static int out[64];

static void exchange(bool barrier) {
	__shared__ int buf[2];
	const int warp = threadIdx.x >> 5;
	if ((threadIdx.x & 31) == 0) buf[warp] = warp + 1;
	if (barrier) __syncthreads();
	out[threadIdx.x] = buf[1 - warp];
}

int main(int argc, char** argv) {
	const std::string mode = argc > 1 ? argv[1] : "";
	if (mode == "divergent") {
		launch(1, 64, [] { if (threadIdx.x < 32) __syncthreads(); });
	} else if (mode == "deadlock") {
		launch(1, 64, [] { if ((threadIdx.x & 31) < 16) (void)__shfl_xor_sync(~0u, 1.0f, 1); });
	} else if (mode == "race" || mode == "synced") {
		launch(1, 64, [&] { exchange(mode == "synced"); });
		std::printf("warp 0 read %d, warp 1 read %d\n", out[0], out[32]);
		return 0;
	} else {
		std::fprintf(stderr, "usage: emu_planted divergent|deadlock|race|synced\n");
		return 1;
	}
	std::printf("no error\n");
	return 0;
}
