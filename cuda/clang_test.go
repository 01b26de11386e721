package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/shaders"
)

// TestKernelsCompile compiles shaders/rms_norm_backward.cu with a real
// CUDA front end, clang's (no CUDA toolkit: testdata/clang_cuda_shim.h
// declares the built-ins NVRTC provides), for sm_80 and sm_90 device code,
// as one program and as each NVRTC program the backend compiles
// (kernelParts: RMS_PART=n must keep exactly that part's kernels), and
// with the benchmark variants' inline PTX. CI has no GPU; this and
// TestKernelsNVRTC (CUDA's own compiler) catch device code that does not
// compile as CUDA (a host function called from a kernel, a template that
// only g++'s host compile of TestKernelsOnCPU accepts) before a GPU host
// does, through two front ends and in seconds. make test installs
// clang-19 (RMSGRAD_CLANG names another); RMSGRAD_REQUIRE_SERVERS=1
// makes its absence a failure.
func TestKernelsCompile(t *testing.T) {
	path := testClang(t)
	src, err := filepath.Abs(filepath.Join("..", "shaders", shaders.CUDAFile))
	if err != nil {
		t.Fatal(err)
	}
	shim, err := filepath.Abs(filepath.Join("testdata", "clang_cuda_shim.h"))
	if err != nil {
		t.Fatal(err)
	}
	entry := regexp.MustCompile(`\.entry (\w+)\(`)
	var all []string
	parts := kernelParts()
	for _, p := range parts {
		all = append(all, p...)
	}
	compile := func(arch string, part int, defs ...string) []string {
		t.Helper()
		ptx := filepath.Join(t.TempDir(), "out.ptx")
		args := []string{"-x", "cuda", "--cuda-device-only", "--cuda-gpu-arch=" + arch, "-nocudainc", "-nocudalib",
			"-std=c++17", "-Xclang", "-target-feature", "-Xclang", "+ptx70", "-include", shim, "-S", "-o", ptx, src}
		if part >= 0 {
			args = append(args, fmt.Sprintf("-DRMS_PART=%d", part))
		}
		args = append(args, defs...)
		out, err := exec.Command(path, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s, %s, part %d: %v\n%s", path, arch, part, err, out)
		}
		b, err := os.ReadFile(ptx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, m := range entry.FindAllStringSubmatch(string(b), -1) {
			names = append(names, m[1])
		}
		return names
	}
	for _, arch := range []string{"sm_80", "sm_90"} {
		if got := compile(arch, -1); !sameSet(got, all) {
			t.Errorf("%s, whole file: kernels %v; want %v", arch, got, all)
		}
	}
	for p, want := range parts {
		if got := compile("sm_90", p); !sameSet(got, want) {
			t.Errorf("RMS_PART=%d: kernels %v; want %v", p, got, want)
		}
	}
	// The benchmark variants' inline PTX (RMSGRAD_CUDA_NVRTC_OPTS).
	if got := compile("sm_90", -1, "-DRMS_GLOBAL_STORES", "-DRMS_VOLATILE_LOADS"); !sameSet(got, all) {
		t.Errorf("with RMS_GLOBAL_STORES and RMS_VOLATILE_LOADS: kernels %v; want %v", got, all)
	}
	// RMSGRAD_CUDA_HALF_SLOTS's c9 (rows_slots, cp.async).
	if got := compile("sm_80", -1, "-DRMS_C9_SLOTS=4", "-DRMS_C9_SLOTS_R=2"); !sameSet(got, all) {
		t.Errorf("with RMS_C9_SLOTS: kernels %v; want %v", got, all)
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, s := range a {
		m[s]++
	}
	for _, s := range b {
		if m[s]--; m[s] < 0 {
			return false
		}
	}
	return true
}

// testClang returns the clang with the NVPTX target that the compile tests
// use (RMSGRAD_CLANG, or clang++-19); it skips the test without one (fails
// it under RMSGRAD_REQUIRE_SERVERS=1).
func testClang(t *testing.T) string {
	t.Helper()
	clang := os.Getenv("RMSGRAD_CLANG")
	if clang == "" {
		// sm_90 needs clang 16 or later; Debian 12's clang++ is 14.
		clang = "clang++-19"
	}
	path, err := exec.LookPath(clang)
	if err == nil {
		var out []byte
		out, err = exec.Command(path, "-print-targets").CombinedOutput()
		if err == nil && !strings.Contains(string(out), "nvptx64") {
			err = fmt.Errorf("%s has no nvptx64 target", path)
		}
	}
	if err != nil {
		if os.Getenv("RMSGRAD_REQUIRE_SERVERS") == "1" {
			t.Fatalf("clang with the NVPTX target is required (apt-get install clang-19): %v", err)
		}
		t.Skipf("no clang with the NVPTX target (apt-get install clang-19): %v", err)
	}
	return path
}
