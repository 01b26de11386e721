package cuda

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// emuStall bounds how long the CPU run of the kernels may go without
// finishing a case (each prints a line as it ends): an endless loop in a
// kernel. (A barrier that can never fill ends the run itself, with a
// message: testdata/emu_shim.h.) Whole runs take 1-4 s alone since the
// shim runs CUDA threads as fibers; the bound leaves room for a loaded CI
// machine.
const emuStall = 3 * time.Minute

// runEmu runs a CPU emulator of the CUDA kernels (buildEmu) twice, its
// fibers scheduled in the forward and then the reverse order
// (RMS_EMU_ORDER, testdata/emu_shim.h: a missing barrier shows in one of
// the two), and returns the first run's output. The two runs must both
// succeed and print the same: every output the emulators print is a
// function of the bits, which must not depend on the schedule.
func runEmu(bin string, args ...string) ([]byte, error) {
	var outs [2][]byte
	for i, order := range []string{"forward", "reverse"} {
		out, err := runWatchedEnv(emuStall, []string{"RMS_EMU_ORDER=" + order}, bin, args...)
		if err != nil {
			return out, fmt.Errorf("fibers in the %s order: %w", order, err)
		}
		outs[i] = out
	}
	if !bytes.Equal(outs[0], outs[1]) {
		a, b := strings.Split(string(outs[0]), "\n"), strings.Split(string(outs[1]), "\n")
		for i := 0; i < len(a) && i < len(b); i++ {
			if a[i] != b[i] {
				return outs[0], fmt.Errorf("the fibers' order changed the output (a race between threads: a missing barrier?) at line %d:\nforward: %s\nreverse: %s", i+1, a[i], b[i])
			}
		}
		return outs[0], fmt.Errorf("the fibers' order changed the output's length: %d lines forward, %d reverse", len(a), len(b))
	}
	return outs[0], nil
}

// TestKernelsOnCPU compiles shaders/rms_norm_backward.cu as C++ with g++
// against a small shim (testdata/kernel_emu.cpp and emu_shim.h: CUDA
// threads as fibers, real barriers, warp shuffles through a per-warp
// exchange, run in two schedule orders that must give the same output) and runs the job-table kernels on the
// CPU: r, dx and dw against a double reference, and the fused entry bitwise
// equal to RMSInv, DX and DW launched apart, for dims 1..9000 (register,
// prefetch and streaming paths, unaligned dims) and multi-row groups; then
// dtype mixes (BF16/F16/F32 inputs and outputs, typed and per-tensor IO,
// the wide, fused, streaming and shared-memory paths): fused against apart
// bit for bit, each half output the F32 output of the same job rounded
// once to nearest even, and the double reference. It is
// the check of the kernel logic that runs without a GPU; the GPU conformance
// suite (TestConformance) is the real one.
func TestKernelsOnCPU(t *testing.T) {
	bin := buildEmu(t, "testdata/kernel_emu.cpp", kernelDef(t))
	out, err := runEmu(bin)
	t.Logf("\n%s", out)
	if err != nil {
		t.Fatalf("kernels on the CPU: %v", err)
	}
}

// TestHalfSlotsOnCPU runs class c9's cases of TestKernelsOnCPU (its fused
// kernel against the general kernel launched apart, bit for bit, and the
// double reference) with c9 compiled as RMSGRAD_CUDA_HALF_SLOTS compiles it
// (RMS_C9_SLOTS: rows in shared-memory slots filled by asynchronous
// copies), the copies emulated landing only when waited for and, for the
// default R, also landing when issued: a slot read before its wait, or
// overwritten while still read, changes the bits.
func TestHalfSlotsOnCPU(t *testing.T) {
	for _, v := range []struct {
		name  string
		defs  []string
		modes [][]string
	}{
		{"P3", []string{"-DRMS_C9_SLOTS=3"}, [][]string{{"half"}, {"half", "eager"}}},
		{"P4R2", []string{"-DRMS_C9_SLOTS=4", "-DRMS_C9_SLOTS_R=2"}, [][]string{{"half"}}},
	} {
		bin := buildEmu(t, "testdata/kernel_emu.cpp", append([]string{kernelDef(t)}, v.defs...)...)
		for _, m := range v.modes {
			out, err := runEmu(bin, m...)
			t.Logf("%s %v:\n%s", v.name, m, out)
			if err != nil {
				t.Errorf("c9 with %v, %v: %v", v.defs, m, err)
			}
			if n := strings.Count(string(out), " ok\n"); n < 6 {
				t.Errorf("c9 with %v, %v: %d cases passed; want the 6 c9 cases", v.defs, m, n)
			}
		}
	}
}

// buildEmu compiles a CPU emulator of CUDA code (src, with g++ options
// args) into a temporary binary. It skips the test under -short (each
// test compiles and runs the kernels, several seconds) and without g++.
func buildEmu(t *testing.T, src string, args ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("the CPU run of the CUDA kernels compiles and runs them, several seconds a test; skipped with -short")
	}
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("g++ not installed: cannot run the CUDA kernels on the CPU")
	}
	bin := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".cpp"))
	args = append([]string{"-O1", "-std=c++20", "-pthread", "-Wall", "-Wno-unknown-pragmas"}, args...)
	out, err := exec.Command(gxx, append(args, "-o", bin, src)...).CombinedOutput()
	if err != nil {
		t.Fatalf("g++ %v %s: %v\n%s", args, src, err, out)
	}
	return bin
}

// kernelDef is the g++ option that points testdata/kernel_emu.cpp at
// shaders/rms_norm_backward.cu.
func kernelDef(t *testing.T) string {
	src, err := filepath.Abs("../shaders/rms_norm_backward.cu")
	if err != nil {
		t.Fatal(err)
	}
	return `-DRMS_CU="` + src + `"`
}

// runWatched runs name with args and returns its stdout and then its
// stderr; it kills the process when stall passes without a new line on
// its stdout.
func runWatched(stall time.Duration, name string, args ...string) ([]byte, error) {
	return runWatchedEnv(stall, nil, name, args...)
}

// runWatchedEnv is runWatched with env added to the process's environment.
func runWatchedEnv(stall time.Duration, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	// After a kill, children that still hold the pipes (a shell's) must
	// not keep Wait waiting.
	cmd.WaitDelay = time.Second
	var out, errOut bytes.Buffer
	cmd.Stderr = &errOut
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- append(append([]byte(nil), sc.Bytes()...), '\n')
		}
	}()
	timer := time.NewTimer(stall)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				err := cmd.Wait()
				out.Write(errOut.Bytes())
				return out.Bytes(), err
			}
			out.Write(l)
			timer.Reset(stall)
		case <-timer.C:
			_ = cmd.Process.Kill()
			_ = cmd.Wait() // closes stdout, which ends the reader
			for l := range lines {
				out.Write(l)
			}
			out.Write(errOut.Bytes())
			return out.Bytes(), fmt.Errorf("no case finished for %v (a deadlock at a barrier, or an endless loop): killed", stall)
		}
	}
}

// TestRunWatched: the watchdog kills a process that stops printing, keeps
// what it printed, and leaves one that keeps printing alone.
func TestRunWatched(t *testing.T) {
	start := time.Now()
	out, err := runWatched(300*time.Millisecond, "sh", "-c", "echo one; sleep 0.1; echo two; sleep 30")
	if err == nil || !strings.Contains(err.Error(), "killed") || string(out) != "one\ntwo\n" {
		t.Fatalf("stalled process: %q, %v", out, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the stalled process was killed after %v", d)
	}
	out, err = runWatched(2*time.Second, "sh", "-c", "for i in 1 2 3 4 5; do echo $i; sleep 0.2; done; echo oops >&2")
	if err != nil || string(out) != "1\n2\n3\n4\n5\noops\n" {
		t.Fatalf("steady process: %q, %v", out, err)
	}
	if _, err := runWatched(2*time.Second, "sh", "-c", "echo x; exit 3"); err == nil {
		t.Fatal("a failing process reported no error")
	}
}

// TestWSLayoutOnCPU runs TestKernelsOnCPU's cases with the classes that
// keep w and the dw sums in shared memory (c4, c8-c12) in the
// element-major layout (RMS_Cc_WS=1, four scalar accesses a piece; the
// default is piece-major): the fused kernels against the general kernel
// launched apart, bit for bit, and the double reference.
func TestWSLayoutOnCPU(t *testing.T) {
	bin := buildEmu(t, "testdata/kernel_emu.cpp", kernelDef(t), "-DRMS_C4_WS=1", "-DRMS_C8_WS=1", "-DRMS_C9_WS=1", "-DRMS_C10_WS=1", "-DRMS_C11_WS=1", "-DRMS_C12_WS=1")
	out, err := runEmu(bin)
	t.Logf("\n%s", out)
	if err != nil {
		t.Fatalf("kernels on the CPU with w and dw element-major in shared memory: %v", err)
	}
}

// TestClassGeomOnCPU runs TestKernelsOnCPU's cases with classes c0, c7 and
// c12 (F32 dims up to 1024, half dims up to 1024 and 1152-2048) in blocks
// of 32 and 64 threads, c7 with w and the dw sums in shared memory and c12
// with them in registers, as RMSGRAD_CUDA_CLASS_GEOM compiles them for a
// benchmark variant: the fused kernels against the general kernel
// launched apart with the same block size, bit for bit, and the double
// reference.
func TestClassGeomOnCPU(t *testing.T) {
	opts, err := parseClassGeom("0:8x32x8,7:4x64x6s,12:4x64x6r", append([]fusedClass(nil), fusedClasses[:]...))
	if err != nil {
		t.Fatal(err)
	}
	bin := buildEmu(t, "testdata/kernel_emu.cpp", append(append(append([]string{kernelDef(t)}, opts[0]...), opts[7]...), opts[12]...)...)
	out, err := runEmu(bin)
	t.Logf("\n%s", out)
	if err != nil {
		t.Fatalf("kernels on the CPU with c0, c7 and c12 in small blocks: %v", err)
	}
}

// TestReduceShapeOnCPU runs jobs of several row groups (each ending in the
// dw reduce) with the reduce launched in blocks of 64 threads, 16 loads in
// flight and its job read after the wait (RMS_RED_CH=2, RMS_RED_U=16,
// RMS_RED_EARLY=0, what RMSGRAD_CUDA_RED_CH and RMSGRAD_CUDA_NVRTC_OPTS
// compile for a benchmark variant) and with the defaults: r, dx and dw must
// be the same bits, case by case, fused and apart.
func TestReduceShapeOnCPU(t *testing.T) {
	var outs [2]string
	for i, defs := range [][]string{nil, {"-DRMS_RED_CH=2", "-DRMS_RED_U=16", "-DRMS_RED_EARLY=0"}} {
		bin := buildEmu(t, "testdata/kernel_emu.cpp", append([]string{kernelDef(t)}, defs...)...)
		out, err := runEmu(bin, "reduce")
		if err != nil {
			t.Fatalf("reduce digests with %v: %v\n%s", defs, err, out)
		}
		outs[i] = string(out)
	}
	if n := strings.Count(outs[0], "digest "); n < 22 {
		t.Fatalf("%d digests; want 22:\n%s", n, outs[0])
	}
	if outs[0] != outs[1] {
		t.Errorf("the reduce's launch shape changed the bits:\ndefault:\n%s\nRMS_RED_CH=2, RMS_RED_U=16, RMS_RED_EARLY=0:\n%s", outs[0], outs[1])
	}
	t.Logf("\n%s", outs[0])
}

// TestProfilesOnCPU runs TestKernelsOnCPU's cases with each device
// profile's geometry and class macros, as the backend compiles them on that
// device: the fused kernels against the general kernel launched apart with
// the same block size, bit for bit, and the double reference.
func TestProfilesOnCPU(t *testing.T) {
	for i := range deviceProfiles {
		p := &deviceProfiles[i]
		t.Run(p.name, func(t *testing.T) {
			b := &Backend{arch: "sm_90"}
			if err := b.applyProfile(p); err != nil {
				t.Fatal(err)
			}
			args := []string{kernelDef(t)}
			for c := range fusedClasses {
				args = append(args, b.classOpts[c]...)
				if n := b.classTable()[c].maxNch; n != fusedClasses[c].maxNch {
					if c != 4 && c != 7 {
						t.Fatalf("class %d's widest row moved, and the emulator's table moves only c4's and c7's", c)
					}
					args = append(args, fmt.Sprintf("-DEMU_C%d_NCH=%d", c, n))
				}
			}
			args = append(args, p.opts...)
			if len(args) == 1 {
				t.Skip("the profile changes nothing the emulator compiles")
			}
			bin := buildEmu(t, "testdata/kernel_emu.cpp", args...)
			out, err := runEmu(bin)
			t.Logf("%v\n%s", args[1:], out)
			if err != nil {
				t.Fatalf("kernels on the CPU with the %s profile: %v", p.name, err)
			}
		})
	}
}

// TestEmuCatchesBugs plants synchronisation bugs and checks that the
// emulators' shim (testdata/emu_shim.h) reports each: a __syncthreads some
// threads never reach and a warp shuffle half a warp makes end the run
// with a message; a read of shared memory another warp writes, with no
// barrier between, prints different values in the two schedule orders,
// which runEmu reports; and shaders/rms_norm_backward.cu with the barrier
// of its block sums removed fails TestKernelsOnCPU's run.
func TestEmuCatchesBugs(t *testing.T) {
	// The fibers switch through x86-64 assembly where it applies, else
	// through ucontext (FIBER_UCONTEXT forces it): both run.
	for _, sw := range []string{"", "-DFIBER_UCONTEXT"} {
		var args []string
		if sw != "" {
			args = append(args, sw)
		}
		bin := buildEmu(t, "testdata/emu_planted.cpp", args...)
		for mode, want := range map[string]string{"divergent": "divergent __syncthreads", "deadlock": "deadlock"} {
			out, err := runWatched(emuStall, bin, mode)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), want) {
				t.Errorf("%s %s: %v\n%s; want exit status 2 and %q", sw, mode, err, out, want)
			}
		}
		if out, err := runEmu(bin, "synced"); err != nil || string(out) != "warp 0 read 2, warp 1 read 1\n" {
			t.Errorf("%s synced: %q, %v", sw, out, err)
		}
		if out, err := runEmu(bin, "race"); err == nil || !strings.Contains(err.Error(), "order changed") {
			t.Errorf("%s race: %q, %v; want the two orders to differ", sw, out, err)
		}
	}

	src, err := os.ReadFile("../shaders/rms_norm_backward.cu")
	if err != nil {
		t.Fatal(err)
	}
	const barrier = "\t\t}\n\t}\n\t__syncthreads();\n#pragma unroll\n\tfor (int q = 0; q < R; q++) {\n\t\tss[q] = warp_sum("
	if strings.Count(string(src), barrier) != 1 {
		t.Fatal("block_sum's barrier is not where this test removes it: update the test")
	}
	planted := filepath.Join(t.TempDir(), "planted.cu")
	if err := os.WriteFile(planted, []byte(strings.Replace(string(src), barrier, strings.Replace(barrier, "__syncthreads();", "", 1), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	kbin := buildEmu(t, "testdata/kernel_emu.cpp", `-DRMS_CU="`+planted+`"`)
	if out, err := runEmu(kbin); err == nil {
		t.Errorf("block_sum without its barrier passed:\n%s", out)
	}
}
