package cuda

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// emuTimeout bounds the CPU run of the kernels.
const emuTimeout = 5 * time.Minute

// TestKernelsOnCPU compiles shaders/rms_norm_backward.cu as C++ with g++
// against a small shim (testdata/kernel_emu.cpp: real barriers, warp
// shuffles through a per-warp exchange) and runs the job-table kernels on the
// CPU: r, dx and dw against a double reference, and the fused entry bitwise
// equal to RMSInv, DX and DW launched apart, for dims 1..9000 (register,
// prefetch and streaming paths, unaligned dims) and multi-row groups. It is
// the check of the kernel logic that runs without a GPU; the GPU conformance
// suite (TestConformance) is the real one.
func TestKernelsOnCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("the CPU run of the CUDA kernels takes about a minute; skipped with -short")
	}
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("g++ not installed: cannot run the CUDA kernels on the CPU")
	}
	src, err := filepath.Abs("../shaders/rms_norm_backward.cu")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kernel_emu")
	out, err := exec.Command(gxx, "-O1", "-std=c++20", "-pthread", "-Wno-unknown-pragmas",
		`-DRMS_CU="`+src+`"`, "-o", bin, "testdata/kernel_emu.cpp").CombinedOutput()
	if err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	// A kernel bug can deadlock the shim's barriers: a deadline kills the
	// run rather than leave it spinning past the test (it takes about a
	// minute on 2 cores).
	ctx, cancel := context.WithTimeout(context.Background(), emuTimeout)
	defer cancel()
	out, err = exec.CommandContext(ctx, bin).CombinedOutput()
	t.Logf("\n%s", out)
	if ctx.Err() != nil {
		t.Fatalf("kernels on the CPU: no result after %v (a deadlock at a barrier, or an endless loop), killed", emuTimeout)
	}
	if err != nil {
		t.Fatalf("kernels on the CPU: %v", err)
	}
}
