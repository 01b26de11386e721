package cuda

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/computetest"
)

// openOrSkip opens the backend or skips the test saying why. With
// RMSGRAD_REQUIRE_CUDA=1 (set on the GPU machine) a missing device fails
// instead, so a skip can never pass for a GPU run.
func openOrSkip(t *testing.T, opts ...Option) *Backend {
	t.Helper()
	b, err := open(opts...)
	if err != nil {
		if !errors.Is(err, compute.ErrUnsupported) {
			t.Fatalf("Open: %v", err)
		}
		if os.Getenv("RMSGRAD_REQUIRE_CUDA") == "1" {
			t.Fatalf("RMSGRAD_REQUIRE_CUDA=1 but no usable CUDA device: %v", err)
		}
		t.Skipf("no CUDA device here (expected on machines without an NVIDIA GPU, as in CI): %v", err)
	}
	return b
}

// On a machine without a GPU, Open must fail fast with ErrUnsupported and a
// reason, never panic; on a GPU machine it must name the device and arch.
func TestOpen(t *testing.T) {
	b := openOrSkip(t)
	defer b.Close()
	if b.Name() != "cuda" {
		t.Errorf("Name() = %q, want cuda", b.Name())
	}
	t.Logf("device %s, %d SMs, NVRTC compile %v, self-check %v", b.DeviceName(), b.sms, b.CompileTime(), b.SelfCheckTime())
	// Registers, local memory (spills) and occupancy of the rows kernels.
	for k, fn := range b.fnRows {
		var regs, local int32
		b.d.cuFuncGetAttribute(&regs, funcAttrNumRegs, fn)
		b.d.cuFuncGetAttribute(&local, funcAttrLocalBytes, fn)
		occ := ""
		if c := kernelClass(k); c >= 0 {
			occ = fmt.Sprintf(", blocks/SM by block size/32 (class c%d): %v", c, b.occ[c])
		}
		t.Logf("%s: %d registers, %d bytes local%s", rowsKernelName(k), regs, local, occ)
	}
}

// The whole conformance suite against the float64 oracle, on the GPU.
func TestConformance(t *testing.T) {
	openOrSkip(t).Close()
	// Each backend reserves a small arena (as the worker reserves
	// pin_reserve_bytes), so the suite's first buffers are carved from it
	// and the rest pinned one by one: both kinds meet in its batches.
	computetest.Run(t, func(t *testing.T) compute.Backend {
		b := openOrSkip(t)
		if _, err := b.Reserve(8 << 20); err != nil {
			t.Fatalf("Reserve: %v", err)
		}
		return b
	})
}

// Buffers carved from the pinned arena (Reserve) are zeroed, mapped where
// the arena is mapped, and give the same bits as buffers pinned one by one,
// on the copy path and the zero-copy path alike; once the arena is used
// up, buffers are pinned as before.
func TestReserve(t *testing.T) {
	ctx := context.Background()
	jobs := []computetest.Job{computetest.NewJob(1, 64, 4096), computetest.NewJob(2, 8, 1024), computetest.NewJob(3, 3, 257),
		computetest.NewJob(4, 512, 1024)} // 2 MiB tensors: mapped, not copied (defaultMapMax)
	plain := openOrSkip(t)
	want, err := computetest.RunJobs(ctx, plain, jobs, computetest.DXThenDW)
	plain.Close()
	if err != nil {
		t.Fatal(err)
	}

	b := openOrSkip(t)
	defer b.Close()
	if d, err := b.Reserve(0); d != 0 || err != nil {
		t.Fatalf("Reserve(0) = %v, %v; want a no-op", d, err)
	}
	const n = 32 << 20
	if _, err := b.Reserve(n); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(n); !errors.Is(err, compute.ErrInvalidArgument) {
		t.Fatalf("second Reserve: %v, want ErrInvalidArgument", err)
	}
	if size, used := b.Reserved(); size != n || used != 0 {
		t.Fatalf("Reserved() = %d, %d; want %d, 0", size, used, n)
	}
	x, err := b.Alloc(compute.F32, 1<<20) // 4 MiB
	if err != nil {
		t.Fatal(err)
	}
	m := x.(*buffer).m
	if !m.arena || m.hdev < b.arenaDev || m.hdev+uint64(m.size) > b.arenaDev+uint64(n) {
		t.Fatalf("a 4 MiB buffer after Reserve(%d): arena %v, mapped at %#x (arena %#x + %d)", n, m.arena, m.hdev, b.arenaDev, n)
	}
	for i, v := range x.Bytes() {
		if v != 0 {
			t.Fatalf("carved buffer: byte %d = %#x, want zero", i, v)
		}
	}
	x.Release()
	for round := range 3 {
		got, err := computetest.RunJobs(ctx, b, jobs, computetest.DXThenDW)
		if err != nil {
			t.Fatal(err)
		}
		for k := range got {
			if d := computetest.BitsEqual(got[k], want[k]); d != "" {
				t.Fatalf("round %d, job %d (arena buffers vs pinned one by one): %s", round, k, d)
			}
		}
	}
	if _, used := b.Reserved(); used == 0 || used > n {
		t.Fatalf("after the jobs the arena has %d of %d bytes used; want some, at most all", used, n)
	}
	// Past the arena: a buffer larger than what is left is pinned alone.
	big, err := b.Alloc(compute.F32, n/4)
	if err != nil {
		t.Fatal(err)
	}
	if big.(*buffer).m.arena {
		t.Fatalf("a %d-byte buffer came from an arena of %d bytes with some used", n, n)
	}
	big.Release()
}

// The pool's limit on a GPU: jobs of one shape, of another and of the
// first again through a backend with a small limit and a reserve give the
// bits of an unbounded backend; after each batch nothing is live and the
// pool is within the limit plus the reserve (TestPoolLimit checks the
// bookkeeping itself on a fake driver).
func TestPoolLimitOnGPU(t *testing.T) {
	ctx := context.Background()
	small := []computetest.Job{computetest.NewJob(1, 64, 4096), computetest.NewJob(2, 8, 1024)}    // 1 MiB tensors: mapped
	large := []computetest.Job{computetest.NewJob(3, 512, 4096), computetest.NewJob(4, 300, 2048)} // 8 MiB and 2.3 MiB: copied
	plain := openOrSkip(t)
	var want [][]computetest.Output
	for _, js := range [][]computetest.Job{small, large} {
		w, err := computetest.RunJobs(ctx, plain, js, computetest.DXThenDW)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, w)
	}
	plain.Close()

	const limit, reserve = 12 << 20, 4 << 20
	b := openOrSkip(t, PoolLimit(limit))
	defer b.Close()
	if _, err := b.Reserve(reserve); err != nil {
		t.Fatal(err)
	}
	for round, i := range []int{0, 1, 0, 1} {
		js := [][]computetest.Job{small, large}[i]
		got, err := computetest.RunJobs(ctx, b, js, computetest.DXThenDW)
		if err != nil {
			t.Fatal(err)
		}
		for k := range got {
			if d := computetest.BitsEqual(got[k], want[i][k]); d != "" {
				t.Fatalf("round %d, job %d (pool limited to %d bytes): %s", round, k, limit, d)
			}
		}
		live, pooled, bound := b.PoolStats()
		t.Logf("round %d: %d bytes live, %d pooled, bound %d", round, live, pooled, bound)
		if live != 0 || pooled > bound || bound != limit+reserve {
			t.Fatalf("round %d: %d bytes live, %d pooled; want none live and at most %d pooled (limit %d + reserve %d)", round, live, pooled, bound, limit, reserve)
		}
	}
}

// A steady-state worker allocates no device or pinned memory: the second
// run of the same batch (buffers released and re-allocated from the pool,
// job table and partials reused) calls cuMemAlloc/cuMemHostAlloc zero times.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	b := openOrSkip(t)
	defer b.Close()
	jobs := []computetest.Job{computetest.NewJob(1, 64, 4096), computetest.NewJob(2, 8, 1024), computetest.NewJob(3, 3, 257)}
	ctx := context.Background()
	first, err := computetest.RunJobs(ctx, b, jobs, computetest.DXThenDW)
	if err != nil {
		t.Fatal(err)
	}
	before := b.allocs.Load()
	for i := 0; i < 3; i++ {
		got, err := computetest.RunJobs(ctx, b, jobs, computetest.AllDXThenAllDW)
		if err != nil {
			t.Fatal(err)
		}
		for k := range got {
			if d := computetest.BitsEqual(got[k], first[k]); d != "" {
				t.Fatalf("run %d job %d: %s", i, k, d)
			}
		}
	}
	if n := b.allocs.Load() - before; n != 0 {
		t.Fatalf("steady state made %d device/pinned allocations, want 0", n)
	}
	st := b.LastStats()
	if st.Jobs != len(jobs) {
		t.Errorf("LastStats().Jobs = %d, want %d fused entries (RMSInv+DX+DW as one)", st.Jobs, len(jobs))
	}
	if st.Kernels <= 0 || st.Total < st.Kernels {
		t.Errorf("LastStats() = %+v: want 0 < Kernels <= Total", st)
	}
}

// The job table layout must match struct Job in the .cu file.
func TestJobEntryLayout(t *testing.T) {
	var e jobEntry
	if jobEntrySize != 96 {
		t.Fatalf("sizeof(jobEntry) = %d, want 96", jobEntrySize)
	}
	for _, f := range []struct {
		name      string
		off, want uintptr
	}{
		{"part", unsafe.Offsetof(e.part), 40}, {"dw", unsafe.Offsetof(e.dw), 48},
		{"rows", unsafe.Offsetof(e.rows), 56}, {"g", unsafe.Offsetof(e.g), 68},
		{"flags", unsafe.Offsetof(e.flags), 72}, {"eps", unsafe.Offsetof(e.eps), 76},
		{"start", unsafe.Offsetof(e.start), 80}, {"rstart", unsafe.Offsetof(e.rstart), 84},
	} {
		if f.off != f.want {
			t.Errorf("offset of %s = %d, want %d", f.name, f.off, f.want)
		}
	}
}

// Buffers of at most mapMax bytes stay in pinned host memory, where the
// kernels read and write them: a batch of small jobs of one dim is one
// copy (the job table) and one launch (a group per job, which stores dw
// itself: no reduce launch), and every batch gives the bits of the same
// batch with every buffer copied and with every buffer mapped, each job
// checked against the oracle.
func TestMappedEqualsCopied(t *testing.T) {
	b := openOrSkip(t)
	defer b.Close()
	ctx := context.Background()
	var small []computetest.Job
	for i := range 64 {
		small = append(small, computetest.NewJob(uint64(100+i), 8, 1024))
	}
	bf16 := computetest.Mix{X: compute.BF16, W: compute.BF16, DY: compute.BF16, DX: compute.BF16, DW: compute.BF16}
	mixed := []computetest.Job{computetest.NewJob(1, 8, 1024), computetest.NewJob(2, 64, 4096), computetest.NewJob(3, 3, 257),
		computetest.NewJob(4, 300, 5120).WithMix(bf16), computetest.NewJob(5, 2, 1), computetest.NewJob(6, 40, 9000),
		computetest.NewJob(7, 1024, 1152).WithMix(computetest.Mix{X: compute.BF16, W: compute.F32, DY: compute.BF16, DX: compute.F32, DW: compute.F32})}
	for _, c := range []struct {
		name string
		jobs []computetest.Job
	}{{"64 jobs of 8x1024", small}, {"mixed shapes and dtypes", mixed}} {
		var first []computetest.Output
		for _, mm := range []int{defaultMapMax, 0, 1 << 30} {
			b.mapMax = mm
			got, err := computetest.RunJobs(ctx, b, c.jobs, computetest.DXThenDW)
			if err != nil {
				t.Fatalf("%s, map bytes %d: %v", c.name, mm, err)
			}
			st := b.LastStats()
			t.Logf("%s, map bytes %d: %+v", c.name, mm, st)
			for k, j := range c.jobs {
				if err := j.Check(got[k]); err != nil {
					t.Fatalf("%s, map bytes %d, job %d: %v", c.name, mm, k, err)
				}
			}
			if first == nil {
				first = got
				if c.jobs[0].Rows == 8 && len(c.jobs) == 64 && (st.Copies != 1 || st.Launches != 1 || st.Mapped == 0) {
					t.Errorf("%s: %d copies, %d launches, %d bytes mapped; want 1 copy (the job table), 1 launch", c.name, st.Copies, st.Launches, st.Mapped)
				}
				continue
			}
			for k := range got {
				if d := computetest.BitsEqual(first[k], got[k]); d != "" {
					t.Fatalf("%s, map bytes %d, job %d: differs from map bytes %d: %s", c.name, mm, k, defaultMapMax, d)
				}
			}
		}
		b.mapMax = defaultMapMax
	}
}
