package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The kernel-geometry harness, cuda/variants/rows.cu, runs only on a GPU
// host, where device time is scarce: a variant that computes wrong bits,
// deadlocks, spills or cannot reach the blocks per SM it asks for wastes
// part of a run. These tests check its kernels here first.

// TestVariantsOnCPU runs the harness's device code on the CPU
// (variants/rows_emu.cpp, g++ and fibers as TestKernelsOnCPU does): each
// fusedA variant (rows in shared-memory slots filled by asynchronous
// copies, emulated landing at once and landing only when waited for) must
// give the bits of the register rows (fused) at the same block size and
// chunk width, and both the double reference's values.
func TestVariantsOnCPU(t *testing.T) {
	bin := buildEmu(t, filepath.Join("variants", "rows_emu.cpp"))
	out, err := runEmu(bin)
	t.Logf("\n%s", out)
	if err != nil {
		t.Fatalf("the harness's kernels on the CPU: %v", err)
	}
}

// TestVariantsCompile checks the whole harness, host code included, with
// clang's CUDA front end against declarations of the CUDA runtime API
// (testdata/harness: nothing is linked or run), for sm_90 as the GPU
// hosts build it with nvcc: a harness that does not compile there costs a
// device run its harness step.
func TestVariantsCompile(t *testing.T) {
	clang := testClang(t)
	out, err := exec.Command(clang, "-x", "cuda", "--cuda-gpu-arch=sm_90", "-nocudainc", "-nocudalib", "-std=c++17",
		"-fsyntax-only", "-Wno-unknown-cuda-version", "-I", filepath.Join("testdata", "harness"),
		filepath.Join("variants", "rows.cu")).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("clang on variants/rows.cu: %v\n%s", err, out)
	}
}

// harnessVariant is one run<...> or runA<...> call in rows.cu's main: the
// kernel's template arguments and the shape and blocks per SM it is timed
// at.
type harnessVariant struct {
	async         bool // runA: fusedA
	elem          string
	t, k, v, s, r int // s: rows in registers (run) or slots (runA)
	ws            bool
	minb          int
	dim, esz, bps int
	line          int
	targs         string
}

// kernel is the harness kernel the variant times.
func (v harnessVariant) kernel() string {
	if v.async {
		return "fusedA"
	}
	return "fused"
}

var (
	harnessShape = regexp.MustCompile(`Shape S\{(\d+), (\d+), (\d)\}`)
	harnessRun   = regexp.MustCompile(`\brun(A?)<([^>]*)>\(S, (\d+)`)
)

// harnessVariants reads the run and runA calls of rows.cu's main, each with
// the Shape declared before it.
func harnessVariants(src string) ([]harnessVariant, error) {
	var out []harnessVariant
	dim, esz := 0, 0
	for i, line := range strings.Split(src, "\n") {
		if m := harnessShape.FindStringSubmatch(line); m != nil {
			dim, _ = strconv.Atoi(m[2])
			esz, _ = strconv.Atoi(m[3])
			continue
		}
		m := harnessRun.FindStringSubmatch(line)
		if m == nil || strings.Contains(line, "static void") {
			continue
		}
		args := strings.Split(m[2], ",")
		if len(args) != 8 || dim == 0 {
			return nil, fmt.Errorf("rows.cu:%d: cannot read %q (want 8 template arguments after a Shape)", i+1, m[0])
		}
		n := make([]int, 8)
		for j, a := range args {
			a = strings.TrimSpace(a)
			args[j] = a
			if j == 0 || j == 6 {
				continue
			}
			v, err := strconv.Atoi(a)
			if err != nil {
				return nil, fmt.Errorf("rows.cu:%d: template argument %d of %q: %v", i+1, j+1, m[0], err)
			}
			n[j] = v
		}
		elem := map[string]string{"B": "unsigned short", "float": "float"}[args[0]]
		if elem == "" {
			return nil, fmt.Errorf("rows.cu:%d: element type %q", i+1, args[0])
		}
		bps, _ := strconv.Atoi(m[3])
		out = append(out, harnessVariant{
			async: m[1] == "A", elem: elem, t: n[1], k: n[2], v: n[3], s: n[4], r: n[5], ws: args[6] == "true", minb: n[7],
			dim: dim, esz: esz, bps: bps, line: i + 1, targs: m[2],
		})
	}
	return out, nil
}

// TestVariantsNVRTC compiles the harness's kernels with NVRTC for sm_90
// (each variant of rows.cu's main as an extern "C" kernel around the same
// body) and checks every fusedA variant against its cubin: no local memory
// (spills), and at least the blocks per SM the harness times it at, with
// its slots (and w and the dw sums, WS) in shared memory at its shape.
// Register rows (fused) are only compiled: some of them are there to show
// that they spill.
func TestVariantsNVRTC(t *testing.T) {
	nv, _, _, _ := testNVRTC(t)
	raw, err := os.ReadFile(filepath.Join("variants", "rows.cu"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(raw)
	a := strings.Index(src, "__device__ __forceinline__ float warp_sum")
	b := strings.Index(src, "#ifndef ROWS_EMU\nstatic float median")
	if a < 0 || b < a {
		t.Fatal("rows.cu: cannot find its device code (from warp_sum to the host code's #ifndef ROWS_EMU)")
	}
	vs, err := harnessVariants(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) == 0 {
		t.Fatal("rows.cu: no run or runA calls found")
	}
	var prog strings.Builder
	prog.WriteString("extern __shared__ float4 dsm[];\n")
	prog.WriteString(src[a:b])
	name := map[string]string{} // kernel of each distinct instantiation
	for _, v := range vs {
		key := fmt.Sprint(v.async, v.targs)
		if _, ok := name[key]; ok {
			continue
		}
		n := fmt.Sprintf("hv_%d", len(name))
		name[key] = n
		body := "body"
		if v.async {
			body = "bodyA"
		}
		targs := v.targs[:strings.LastIndex(v.targs, ",")] // without MINB
		targs = strings.Replace(targs, "B,", "unsigned short,", 1)
		e := v.elem
		fmt.Fprintf(&prog, "extern \"C\" __global__ void __launch_bounds__(%d, %d) %s(const %s* __restrict__ x, const float* __restrict__ w, const %s* __restrict__ dy, %s* __restrict__ dx, float* __restrict__ part, int rows, int dim, float eps) { %s<%s>(x, w, dy, dx, part, rows, dim, eps); }\n",
			v.t, v.minb, n, e, e, e, body, targs)
	}
	bk := &Backend{nv: nv, arch: "sm_90"}
	cubin, err := bk.compileSource(prog.String(), "rows.cu", []string{"--gpu-architecture=sm_90", "--std=c++17"})
	if err != nil {
		t.Fatal(err)
	}
	lim := archLimits["sm_90"]
	ks, err := parseCubin(cubin, lim.inSection)
	if err != nil {
		t.Fatal(err)
	}
	async := 0
	for _, v := range vs {
		k := ks[name[fmt.Sprint(v.async, v.targs)]]
		if k == nil {
			t.Errorf("rows.cu:%d: %s<%s> is not in the cubin", v.line, v.kernel(), v.targs)
			continue
		}
		dyn := 0
		if v.ws {
			dyn = 8 * v.dim
		}
		if v.async {
			dyn += v.s * 2 * v.dim * v.esz
		}
		occ := lim.occupancy(k, v.t, dyn)
		t.Logf("rows.cu:%d: %s<%s> at dim %d: %d registers, %d bytes local, %d+%d bytes shared, %d blocks per SM (times %d)",
			v.line, v.kernel(), v.targs, v.dim, k.Regs, k.Local, k.Shared, dyn, occ, v.bps)
		if !v.async {
			continue
		}
		async++
		if k.Local > 0 {
			t.Errorf("rows.cu:%d: fusedA<%s> uses %d bytes of local memory a thread (spills)", v.line, v.targs, k.Local)
		}
		if k.Shared+dyn > lim.smemOptin {
			t.Errorf("rows.cu:%d: fusedA<%s> at dim %d needs %d+%d bytes of shared memory a block; the opt-in maximum is %d",
				v.line, v.targs, v.dim, k.Shared, dyn, lim.smemOptin)
		}
		if occ < v.bps {
			t.Errorf("rows.cu:%d: fusedA<%s> at dim %d fits %d blocks per SM (%d registers, %d+%d bytes shared); the harness times it at %d and would skip it",
				v.line, v.targs, v.dim, occ, k.Regs, k.Shared, dyn, v.bps)
		}
	}
	if async == 0 {
		t.Error("rows.cu: no runA variants found")
	}
}
