package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/shaders"
)

// Under NVRTC 11.8, the compiler make test pins (scripts/nvrtc.sh), no
// fused kernel uses local memory (spills): a kernel that does fails
// TestKernelsNVRTC. The GPU hosts' newer NVRTC is reported by TestOpen
// instead. The half classes' kernels at the 80-register cap of three
// blocks of 256 a multiprocessor (c7, c8) spilled 8 to 56 bytes while one
// kernel held both half dtypes, and store helpers written as inline
// functions once made c9 spill: such a change is worth a look before it
// reaches a GPU.

// fusedKernelClasses maps each fused kernel's name to its class.
func fusedKernelClasses() map[string]int {
	m := map[string]int{}
	for k := kFused0; k < nKernels; k++ {
		m[fusedKernelName(k)] = kernelClass(k)
	}
	return m
}

// result is one program's compile.
type result struct {
	cubin []byte
	err   error
	took  time.Duration
}

// checkSASS disassembles the fused classes' sm_90 code with cuobjdump and
// nvdisasm (beside the libnvrtc, as scripts/nvrtc.sh leaves them, or on
// PATH) and checks the property the half-precision rate rests on: every
// row chunk moves in one 16-byte access. Each class's kernel must hold at least
// 2*S*K 16-byte global loads (x and dy, for the S rows in registers of K
// chunks a thread) and K 16-byte stores (dx) for each row dtype it is
// compiled for (F32, or BF16 and F16). Rows loaded 8 bytes at a time, as
// half rows were before, held the bf16 classes at 70-73% of a device copy
// on the H200, against 83-91% in 16-byte loads.
//
// globalStores: the cubins are the RMS_GLOBAL_STORES variant's, whose
// 16-byte stores must all be global ones (STG, none generic).
func checkSASS(t *testing.T, lib string, cubins []result, parts [][]string, globalStores bool) {
	t.Helper()
	// cuobjdump runs nvdisasm for sm_90 code: NVDISASM_PATH points at the
	// one beside it.
	tool := filepath.Join(filepath.Dir(lib), "cuobjdump")
	env := os.Environ()
	if _, err := os.Stat(filepath.Join(filepath.Dir(lib), "nvdisasm")); err == nil {
		env = append(env, "NVDISASM_PATH="+filepath.Dir(lib))
	}
	if _, err := os.Stat(tool); err != nil {
		if tool, err = exec.LookPath("cuobjdump"); err != nil {
			if os.Getenv("RMSGRAD_REQUIRE_SERVERS") == "1" {
				t.Fatalf("cuobjdump is required (scripts/nvrtc.sh unpacks one beside libnvrtc): %v", err)
			}
			t.Logf("no cuobjdump beside %s or on PATH: the SASS is not checked", lib)
			return
		}
	}
	sdef := regexp.MustCompile(`(?m)^#define RMS_C(\d+)_S (\d+)$`)
	rowsInRegs := map[int]int{}
	for _, m := range sdef.FindAllStringSubmatch(shaders.CUDASource, -1) {
		c, _ := strconv.Atoi(m[1])
		rowsInRegs[c], _ = strconv.Atoi(m[2])
	}
	op := regexp.MustCompile(`\b(LDG|STG|ST)\.E(\.[A-Z0-9]+)*`)
	classOfName := fusedKernelClasses()
	for p, names := range parts {
		if p >= len(cubins) || cubins[p].err != nil || !slices.ContainsFunc(names, func(n string) bool {
			_, ok := classOfName[n]
			return ok
		}) {
			continue
		}
		f := filepath.Join(t.TempDir(), "k.cubin")
		if err := os.WriteFile(f, cubins[p].cubin, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(tool, "-sass", f)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s -sass (RMS_PART=%d): %v\n%s", tool, p, err, out)
		}
		// counts[kernel][opcode]
		counts := map[string]map[string]int{}
		var fn string
		for _, line := range strings.Split(string(out), "\n") {
			if name, ok := strings.CutPrefix(strings.TrimSpace(line), "Function : "); ok {
				fn = name
				counts[fn] = map[string]int{}
				continue
			}
			if fn != "" {
				for _, m := range op.FindAllString(line, -1) {
					counts[fn][m]++
				}
			}
		}
		for _, name := range names {
			c, ok := classOfName[name]
			if !ok {
				continue
			}
			fc, S := fusedClasses[c], rowsInRegs[c]
			if S == 0 {
				t.Errorf("%s: no #define RMS_C%d_S in the source", name, c)
				continue
			}
			const dtypes = 1 // a kernel's rows have one dtype
			k := counts[name]
			var ld16, st16, generic16 int
			for o, n := range k {
				switch {
				case strings.HasPrefix(o, "LDG.E.128"):
					ld16 += n
				case strings.HasPrefix(o, "ST.E.128"):
					st16 += n
					generic16 += n
				case strings.HasPrefix(o, "STG.E.128"):
					st16 += n
				}
			}
			if globalStores {
				if generic16 > 0 || st16 < fc.k*dtypes {
					t.Errorf("%s with RMS_GLOBAL_STORES: %d 16-byte stores, %d of them generic; want at least %d, all global (STG)", name, st16, generic16, fc.k*dtypes)
				}
				continue
			}
			t.Logf("sm_90 %s: %d 16-byte loads, %d 16-byte stores (global loads and stores: %v)", name, ld16, st16, k)
			if want := 2 * S * fc.k * dtypes; ld16 < want {
				t.Errorf("%s: %d 16-byte global loads; its %d rows of %d chunks (x and dy, %d row dtypes) need at least %d", name, ld16, S, fc.k, dtypes, want)
			}
			if want := fc.k * dtypes; st16 < want {
				t.Errorf("%s: %d 16-byte stores; dx's %d chunks a row (%d row dtypes) need at least %d", name, st16, fc.k, dtypes, want)
			}
		}
	}
}

// testNVRTC loads the NVRTC of RMSGRAD_TEST_NVRTC (or the usual places)
// and returns it, its path and version; it skips the test without one
// (fails it under RMSGRAD_REQUIRE_SERVERS=1).
func testNVRTC(t *testing.T) (nv *nvrtcAPI, lib string, major, minor int32) {
	t.Helper()
	cands := nvrtcCandidates()
	if p := os.Getenv("RMSGRAD_TEST_NVRTC"); p != "" {
		cands = []string{p}
	}
	nv, lib, err := loadNVRTCFrom(cands)
	if err != nil {
		if os.Getenv("RMSGRAD_REQUIRE_SERVERS") == "1" {
			t.Fatalf("NVRTC is required (RMSGRAD_TEST_NVRTC=$(scripts/nvrtc.sh) unpacks one): %v", err)
		}
		t.Skipf("no NVRTC here (RMSGRAD_TEST_NVRTC=$(scripts/nvrtc.sh) unpacks Debian's): %v", err)
	}
	nv.nvrtcVersion(&major, &minor)
	t.Logf("NVRTC %d.%d from %s", major, minor, lib)
	return nv, lib, major, minor
}

// localUnder118 is the local memory (spills) a fused kernel may use under
// NVRTC 11.8, in bytes a thread; every other kernel uses none. c8 keeps w
// and the dw sums piece-major in shared memory at 80 registers (three
// blocks of 256 a SM) and spills 8 bytes, which ran faster on the H100
// than the spill-free variants (shaders/rms_norm_backward.cu, RMS_C8_WS).
// c12 (c7's kernel with w and the dw sums in shared memory at six blocks
// of 128 a SM) is capped at 80 registers too and spills the same 8 bytes;
// as a variant of c7 it ran bf16 1536 and 2048 3.4-3.6 points faster than
// c7 in registers (H100 run 48, docs/cuda.md).
var localUnder118 = map[string]int{
	"rms_norm_backward_rows_fused_c8":      8,
	"rms_norm_backward_rows_fused_c8_f16":  8,
	"rms_norm_backward_rows_fused_c12":     8,
	"rms_norm_backward_rows_fused_c12_f16": 8,
}

// TestKernelsNVRTC compiles every program of the kernels (kernelParts) with
// NVRTC, through the backend's own compileKernels (its options, its
// RMS_PART split), for sm_90 (H100, H200) and sm_80 (A100), on a machine
// with no GPU: NVRTC needs no device. It takes RMSGRAD_TEST_NVRTC (make
// test sets it to scripts/nvrtc.sh's unpacking of Debian's libnvrtc, CUDA
// 11.8; a variable of its own, so that the backend's tests on a GPU host
// keep the host's NVRTC), else the library the backend would load, and
// RMSGRAD_REQUIRE_SERVERS=1 makes its absence a failure. From each cubin it
// reads what the driver would report of each kernel and checks what Open
// and the planner take for granted:
//   - each program holds exactly its part's kernels;
//   - each fused class's launch bounds are the Go table's (fusedClasses:
//     block size), and at the registers and shared memory the compiler gave
//     it (w and the dw sums included for c4 and c8-c11) the class's blocks
//     per multiprocessor fit at its widest row, as its launch bounds
//     promise;
//   - the w-in-shared-memory classes' dynamic shared memory, which Open
//     sets as the kernel's limit, is within the architecture's opt-in
//     maximum, and the general kernel's static shared memory within
//     smemReserve (Open gives it the opt-in maximum less that; more, and
//     the driver refuses the attribute: CUDA_ERROR_INVALID_VALUE);
//   - the reduction's block is rowsThreads, and the general kernel takes
//     the block of every class (it runs a class's dims apart with the same
//     block, for the same bits).
//
// With cuobjdump (beside the libnvrtc, as scripts/nvrtc.sh leaves it, or
// on PATH; required under RMSGRAD_REQUIRE_SERVERS=1) it also checks the
// fused classes' SASS (checkSASS), and that the RMS_GLOBAL_STORES
// benchmark variant compiles with global 16-byte stores only.
//
// Registers and local memory per kernel are logged; with
// RMSGRAD_CUDA_RESOURCES=file.md they are also written as a table. Local
// memory is asserted only under NVRTC 11.8 (localUnder118 names the
// exceptions): it depends on the compiler's version, and the GPU hosts
// run a newer NVRTC than the one here (TestOpen logs theirs).
func TestKernelsNVRTC(t *testing.T) {
	nv, lib, major, minor := testNVRTC(t)

	archs := []string{"sm_90", "sm_80"}
	parts := kernelParts()
	res := make(map[string][]result, len(archs))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for _, arch := range archs {
		res[arch] = make([]result, len(parts))
		b := &Backend{nv: nv, arch: arch}
		for p := range parts {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				t0 := time.Now()
				c, err := b.compileKernels(p)
				mu.Lock()
				res[arch][p] = result{c, err, time.Since(t0)}
				mu.Unlock()
			})
		}
	}
	wg.Wait()

	var table strings.Builder
	fmt.Fprintf(&table, "NVRTC %d.%d, `%s`: registers per thread and local memory per thread (bytes) of each kernel\n\n| kernel | block (launch bounds) |", major, minor, strings.Join((&Backend{arch: "ARCH"}).compileOpts(-1), " "))
	for _, arch := range archs {
		fmt.Fprintf(&table, " %s registers | %s local |", arch, arch)
	}
	table.WriteString("\n|---|---|" + strings.Repeat("---|---|", len(archs)) + "\n")
	rowsOf := map[string][]string{}
	var names []string

	for _, arch := range archs {
		lim := archLimits[arch]
		kernels := map[string]*kernelRes{}
		for p, want := range parts {
			r := res[arch][p]
			if r.err != nil {
				t.Errorf("%s, RMS_PART=%d: %v", arch, p, r.err)
				continue
			}
			got, err := parseCubin(r.cubin, lim.inSection)
			if err != nil {
				t.Errorf("%s, RMS_PART=%d: reading the cubin: %v", arch, p, err)
				continue
			}
			var have []string
			for name, k := range got {
				have = append(have, name)
				kernels[name] = k
			}
			if !sameSet(have, want) {
				t.Errorf("%s, RMS_PART=%d: the cubin holds %v; want %v", arch, p, have, want)
			}
			t.Logf("%s, RMS_PART=%d: compiled in %v", arch, p, r.took.Round(time.Millisecond))
		}
		gen := kernels[shaders.CUDARowsKernel]
		for kf := kFused0; kf < nKernels; kf++ {
			name, c := fusedKernelName(kf), kernelClass(kf)
			k, fc := kernels[name], fusedClasses[c]
			if k == nil {
				continue
			}
			if k.MaxThreads != fc.maxThreads {
				t.Errorf("%s: %s has launch bounds of %d threads; fusedClasses[%d] says %d", arch, name, k.MaxThreads, c, fc.maxThreads)
			}
			dyn := (&Backend{}).classSmem(c, fc.maxDim(fc.maxThreads))
			// The promise holds for the class's widest row, in the block
			// the planner gives it (c4's and c10's blocks could hold wider
			// rows than the class takes).
			widest, wt := classOf(fc.maxNch*fc.cw, fc.cw)
			if widest != c {
				t.Errorf("%s: class %d's widest row (%d chunks) goes to class %d", arch, c, fc.maxNch, widest)
			}
			wdyn := (&Backend{}).classSmem(c, fc.maxNch*fc.cw)
			if occ := lim.occupancy(k, wt, wdyn); occ < fc.minBlocks {
				t.Errorf("%s: %s at %d threads, %d registers, %d+%d bytes of shared memory: %d blocks a multiprocessor; the class promises %d",
					arch, name, wt, k.Regs, k.Shared, wdyn, occ, fc.minBlocks)
			}
			if k.Shared+dyn > lim.smemOptin {
				t.Errorf("%s: %s needs %d+%d bytes of shared memory a block; the opt-in maximum is %d", arch, name, k.Shared, dyn, lim.smemOptin)
			}
			if gen != nil && gen.MaxThreads < fc.maxThreads {
				t.Errorf("%s: the general kernel's launch bounds (%d threads) are under class c%d's block (%d): it could not run that class's dims apart",
					arch, gen.MaxThreads, c, fc.maxThreads)
			}
			if major == 11 && minor == 8 && os.Getenv("RMSGRAD_CUDA_NVRTC_OPTS") == "" {
				if allowed := localUnder118[name]; k.Local > allowed {
					t.Errorf("%s: %s uses %d bytes of local memory a thread (spills) under NVRTC 11.8; it used %d", arch, name, k.Local, allowed)
				}
			}
		}
		if gen != nil && gen.Shared > smemReserve {
			t.Errorf("%s: the general kernel has %d bytes of static shared memory; Open sets its dynamic limit to the opt-in maximum less %d (smemReserve), which the driver then refuses",
				arch, gen.Shared, smemReserve)
		}
		if red := kernels[shaders.CUDAReduceKernel]; red != nil && red.MaxThreads != rowsThreads {
			t.Errorf("%s: the dw reduction's launch bounds are %d threads; it is launched with rowsThreads (%d)", arch, red.MaxThreads, rowsThreads)
		}
		for _, part := range parts {
			for _, name := range part {
				k := kernels[name]
				if k == nil {
					continue
				}
				if _, ok := rowsOf[name]; !ok {
					names = append(names, name)
					rowsOf[name] = []string{fmt.Sprint(k.MaxThreads)}
				}
				rowsOf[name] = append(rowsOf[name], fmt.Sprint(k.Regs), fmt.Sprint(k.Local))
				t.Logf("%s %-36s %3d registers (cap %3d), %4d bytes local, %5d bytes static shared, launch bounds %d threads",
					arch, name, k.Regs, k.MaxRegs, k.Local, k.Shared, k.MaxThreads)
			}
		}
	}
	checkSASS(t, lib, res["sm_90"], parts, false)
	// The RMS_GLOBAL_STORES variant (a benchmark knob): it compiles, and
	// its 16-byte stores are global ones.
	if os.Getenv("RMSGRAD_CUDA_NVRTC_OPTS") == "" {
		t.Setenv("RMSGRAD_CUDA_NVRTC_OPTS", "-DRMS_GLOBAL_STORES")
		b := &Backend{nv: nv, arch: "sm_90"}
		vres := make([]result, len(parts))
		var vwg sync.WaitGroup
		fused := fusedKernelClasses()
		for p, names := range parts {
			if !slices.ContainsFunc(names, func(n string) bool { _, ok := fused[n]; return ok }) {
				vres[p].err = fmt.Errorf("not compiled")
				continue
			}
			vwg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				c, err := b.compileKernels(p)
				vres[p] = result{cubin: c, err: err}
				if err != nil {
					t.Errorf("RMS_GLOBAL_STORES, RMS_PART=%d: %v", p, err)
				}
			})
		}
		vwg.Wait()
		checkSASS(t, lib, vres, parts, true)
		t.Setenv("RMSGRAD_CUDA_NVRTC_OPTS", "")
		checkHalfSlots(t, nv, parts, major == 11 && minor == 8)
	}
	if path := os.Getenv("RMSGRAD_CUDA_RESOURCES"); path != "" {
		for _, name := range names {
			fmt.Fprintf(&table, "| %s | %s |\n", name, strings.Join(rowsOf[name], " | "))
		}
		if err := os.WriteFile(path, []byte(table.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkHalfSlots compiles class c9 as RMSGRAD_CUDA_HALF_SLOTS has it (a
// benchmark variant: rows in shared-memory slots, w and the dw sums in
// registers) for sm_90 and checks what a device run of it needs: the
// launch bounds of the class, no spills (under NVRTC 11.8, v118), and at
// the slots' shared memory (Backend.classSmem) the blocks per SM each
// variant must reach at c9's narrowest dim, 4224 (160 threads), and one at
// its widest, 5120 (160).
func checkHalfSlots(t *testing.T, nv *nvrtcAPI, parts [][]string, v118 bool) {
	for _, c9 := range []string{shaders.CUDARowsFusedKernels[halfSlotsClass], shaders.CUDARowsFusedF16Kernels[halfSlotsClass-firstHalfClass]} {
		checkHalfSlotsKernel(t, nv, parts, v118, c9)
	}
}

// checkHalfSlotsKernel is checkHalfSlots for one of c9's kernels.
func checkHalfSlotsKernel(t *testing.T, nv *nvrtcAPI, parts [][]string, v118 bool, c9 string) {
	part := slices.IndexFunc(parts, func(names []string) bool { return slices.Contains(names, c9) })
	if part < 0 {
		t.Fatalf("no program holds %s", c9)
	}
	lim := archLimits["sm_90"]
	for _, v := range []struct {
		env   string // as RMSGRAD_CUDA_HALF_SLOTS
		p, r  int
		atMin int // blocks per SM it must reach at 4224
	}{{"3", 3, 1, 3}, {"2", 2, 1, 3}, {"4,2", 4, 2, 3}} {
		b := &Backend{nv: nv, arch: "sm_90", halfSlots: v.p, halfSlotsR: v.r}
		cubin, err := b.compileKernels(part)
		if err != nil {
			t.Errorf("RMSGRAD_CUDA_HALF_SLOTS=%s: %v", v.env, err)
			continue
		}
		ks, err := parseCubin(cubin, lim.inSection)
		if err != nil {
			t.Fatal(err)
		}
		k := ks[c9]
		if k == nil {
			t.Errorf("RMSGRAD_CUDA_HALF_SLOTS=%s: no %s in the cubin", v.env, c9)
			continue
		}
		fc := fusedClasses[halfSlotsClass]
		occMin, occMax := lim.occupancy(k, 160, b.classSmem(halfSlotsClass, 4224)), lim.occupancy(k, 160, b.classSmem(halfSlotsClass, 5120))
		t.Logf("RMSGRAD_CUDA_HALF_SLOTS=%s: %s %d registers, %d bytes local, %d bytes static shared; %d blocks per SM at 4224, %d at 5120",
			v.env, c9, k.Regs, k.Local, k.Shared, occMin, occMax)
		if k.MaxThreads != fc.maxThreads {
			t.Errorf("RMSGRAD_CUDA_HALF_SLOTS=%s: launch bounds of %d threads; the class's are %d", v.env, k.MaxThreads, fc.maxThreads)
		}
		if v118 && k.Local > 0 {
			t.Errorf("RMSGRAD_CUDA_HALF_SLOTS=%s: %d bytes of local memory a thread (spills) under NVRTC 11.8", v.env, k.Local)
		}
		if occMin < v.atMin || occMax < 1 {
			t.Errorf("RMSGRAD_CUDA_HALF_SLOTS=%s: %d blocks per SM at 4224 (want %d), %d at 5120 (want 1)", v.env, occMin, v.atMin, occMax)
		}
		if b.classSmem(halfSlotsClass, 5120)+k.Shared > lim.smemOptin {
			t.Errorf("RMSGRAD_CUDA_HALF_SLOTS=%s: %d+%d bytes of shared memory at 5120; the opt-in maximum is %d", v.env, b.classSmem(halfSlotsClass, 5120), k.Shared, lim.smemOptin)
		}
	}
}
