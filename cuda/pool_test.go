package cuda

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
)

// fakeMem is a driver that hands out host memory from Go and device
// pointers from a counter, and fails a test on a free of memory it did not
// hand out (a double free): the pool's bookkeeping runs on any machine.
type fakeMem struct {
	t    *testing.T
	mu   sync.Mutex
	host map[unsafe.Pointer][]byte
	dev  map[uint64]int
	next uint64
	// hostAllocs and hostFrees count cuMemHostAlloc and cuMemFreeHost;
	// failDev fails every cuMemAlloc (out of device memory).
	hostAllocs, hostFrees int
	failDev               bool
}

func newFakeBackend(t *testing.T, opts ...Option) (*Backend, *fakeMem) {
	f := &fakeMem{t: t, host: map[unsafe.Pointer][]byte{}, dev: map[uint64]int{}, next: 1 << 20}
	d := &driverAPI{
		cuCtxSetCurrent: func(uintptr) cuResult { return 0 },
		cuMemAlloc: func(p *uint64, n uintptr) cuResult {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.failDev {
				return 2 // CUDA_ERROR_OUT_OF_MEMORY
			}
			*p = f.next
			f.dev[f.next] = int(n)
			f.next += uint64(n+255) &^ 255
			return 0
		},
		cuMemFree: func(p uint64) cuResult {
			f.mu.Lock()
			defer f.mu.Unlock()
			if _, ok := f.dev[p]; !ok {
				f.t.Errorf("cuMemFree(%#x): not allocated (double free?)", p)
				return 1
			}
			delete(f.dev, p)
			return 0
		},
		cuMemHostAlloc: func(p *unsafe.Pointer, n uintptr, _ uint32) cuResult {
			f.mu.Lock()
			defer f.mu.Unlock()
			b := make([]byte, n)
			*p = unsafe.Pointer(&b[0])
			f.host[*p] = b
			f.hostAllocs++
			return 0
		},
		cuMemFreeHost: func(p unsafe.Pointer) cuResult {
			f.mu.Lock()
			defer f.mu.Unlock()
			if _, ok := f.host[p]; !ok {
				f.t.Errorf("cuMemFreeHost(%p): not allocated (double free?)", p)
				return 1
			}
			delete(f.host, p)
			f.hostFrees++
			return 0
		},
		cuMemHostGetDevicePtr: func(d *uint64, p unsafe.Pointer, _ uint32) cuResult {
			*d = uint64(uintptr(p))
			return 0
		},
	}
	return newBackend(d, opts...), f
}

// closeFreesAll closes be and checks that the fake driver has nothing out.
func closeFreesAll(t *testing.T, be *Backend, f *fakeMem) {
	t.Helper()
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	if h, d := f.held(); h != 0 || d != 0 {
		t.Fatalf("after Close: %d host and %d device bytes still allocated", h, d)
	}
}

// held is how much host and device memory the fake driver has out.
func (f *fakeMem) held() (host, dev int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.host {
		host += len(b)
	}
	for _, n := range f.dev {
		dev += n
	}
	return host, dev
}

// With PoolLimit, buffers in use and pooled together stay within the limit
// while pooled buffers of other sizes can be freed: a worker whose jobs
// change shape does not keep the old shape's buffers pinned. Without it,
// every released buffer stays until Close. Close frees everything.
func TestPoolLimit(t *testing.T) {
	const a = 1 << 20 // a size class (sizeClass(a) == a)
	const b = 3 << 19 // another, 1.5 MiB
	alloc := func(t *testing.T, be *Backend, n, count int) []compute.Buffer {
		var bufs []compute.Buffer
		for range count {
			x, err := be.Alloc(compute.BF16, n/2)
			if err != nil {
				t.Fatal(err)
			}
			bufs = append(bufs, x)
		}
		return bufs
	}
	release := func(bufs []compute.Buffer) {
		for _, x := range bufs {
			x.Release()
		}
	}
	check := func(t *testing.T, be *Backend, wantLive, wantPooled int64) {
		t.Helper()
		live, pooled, _ := be.PoolStats()
		if live != wantLive || pooled != wantPooled {
			t.Fatalf("pool: %d live, %d pooled; want %d, %d", live, pooled, wantLive, wantPooled)
		}
	}

	t.Run("unbounded", func(t *testing.T) {
		be, f := newFakeBackend(t)
		release(alloc(t, be, a, 4))
		release(alloc(t, be, b, 4))
		check(t, be, 0, 4*a+4*b)
		if f.hostFrees != 0 {
			t.Fatalf("%d buffers freed with no limit", f.hostFrees)
		}
		closeFreesAll(t, be, f)
	})

	t.Run("shape change", func(t *testing.T) {
		be, f := newFakeBackend(t, PoolLimit(4*a))
		release(alloc(t, be, a, 4))
		check(t, be, 0, 4*a)
		// Two buffers of b need 3 MiB: three of the four pooled a buffers
		// are freed to make room (one a and two b: 4 MiB).
		bs := alloc(t, be, b, 2)
		check(t, be, 2*b, a)
		if f.hostFrees != 3 {
			t.Fatalf("%d buffers freed to make room, want 3", f.hostFrees)
		}
		release(bs)
		check(t, be, 0, a+2*b)
		if h, d := f.held(); h > 4*a || d > 4*a {
			t.Fatalf("%d host and %d device bytes held, over the limit of %d", h, d, 4*a)
		}
		// The pooled buffers are reused with no new allocation.
		n := f.hostAllocs
		release(alloc(t, be, b, 2))
		release(alloc(t, be, a, 1))
		if f.hostAllocs != n {
			t.Fatalf("%d new pinned allocations for buffers in the pool", f.hostAllocs-n)
		}
		closeFreesAll(t, be, f)
	})

	t.Run("over the limit in use", func(t *testing.T) {
		// Buffers in use are never taken back: the third is allocated past
		// the limit, and released buffers are freed until the pool is back
		// under it.
		be, f := newFakeBackend(t, PoolLimit(2*a))
		bufs := alloc(t, be, a, 3)
		check(t, be, 3*a, 0)
		release(bufs[:1])
		check(t, be, 2*a, 0)
		if f.hostFrees != 1 {
			t.Fatalf("%d buffers freed at release over the limit, want 1", f.hostFrees)
		}
		release(bufs[1:])
		check(t, be, 0, 2*a)
		release(bufs) // a second Release does nothing
		check(t, be, 0, 2*a)
		if err := be.Close(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("arena pieces apart", func(t *testing.T) {
		// The arena is freed whole: its pieces stay pooled and do not
		// count against the limit, so a new shape's buffers are pooled
		// beside an old shape's pieces instead of being pinned and freed
		// job by job; the buffers outside the arena keep to the limit.
		be, f := newFakeBackend(t, PoolLimit(2*a))
		if _, err := be.Reserve(2 * a); err != nil {
			t.Fatal(err)
		}
		bufs := alloc(t, be, a, 3) // two from the arena, one pinned alone
		if f.hostAllocs != 2 {
			t.Fatalf("%d pinned allocations, want the arena and one buffer", f.hostAllocs)
		}
		check(t, be, 3*a, 0)
		release(bufs)
		check(t, be, 0, 3*a)
		if f.hostFrees != 0 {
			t.Fatalf("%d buffers freed, want none (a outside the arena, within the limit)", f.hostFrees)
		}
		// A new shape: the pooled buffer outside the arena makes room
		// (a + 1.5a > 2a), the arena's pieces stay.
		bs := alloc(t, be, b, 1)
		check(t, be, b, 2*a)
		if f.hostFrees != 1 {
			t.Fatalf("%d buffers freed for the new shape, want the one outside the arena", f.hostFrees)
		}
		release(bs)
		check(t, be, 0, 2*a+b)
		n := f.hostAllocs
		release(alloc(t, be, b, 1))
		if f.hostAllocs != n {
			t.Fatalf("the new shape's buffer was pinned again (%d allocations)", f.hostAllocs-n)
		}
		if _, _, limit := be.PoolStats(); limit != 4*a {
			t.Fatalf("PoolStats limit %d, want the limit plus the arena, %d", limit, 4*a)
		}
		closeFreesAll(t, be, f)
	})

	t.Run("failed allocation", func(t *testing.T) {
		be, f := newFakeBackend(t, PoolLimit(4*a))
		f.failDev = true
		if _, err := be.Alloc(compute.BF16, a/2); !errors.Is(err, compute.ErrDevice) {
			t.Fatalf("Alloc with the device out of memory: %v, want ErrDevice", err)
		}
		check(t, be, 0, 0)
		if err := be.Close(); err != nil {
			t.Fatal(err)
		}
	})

	for _, reserve := range []int64{0, 3 * a} {
		t.Run(fmt.Sprintf("concurrent, reserve %d", reserve), func(t *testing.T) {
			concurrent(t, reserve)
		})
	}
}

// concurrent runs handlers allocating and releasing side by side (go test
// -race): no double free, and once all is released nothing is live and
// the pool is within the limit plus the reserve.
func concurrent(t *testing.T, reserve int64) {
	const a, b = 1 << 20, 3 << 19
	{
		const limit = 8 * a
		be, f := newFakeBackend(t, PoolLimit(limit))
		if _, err := be.Reserve(reserve); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 50 {
					n := a
					if (g+i)%3 == 0 {
						n = b
					}
					x, err := be.Alloc(compute.BF16, n/2)
					if err != nil {
						t.Error(err)
						return
					}
					x.Bytes()[0] = byte(i)
					x.Release()
				}
			})
		}
		wg.Wait()
		live, pooled, bound := be.PoolStats()
		if live != 0 || pooled > bound || bound != limit+reserve {
			t.Fatalf("pool after the handlers: %d live, %d pooled (bound %d: limit %d, reserve %d)", live, pooled, bound, limit, reserve)
		}
		size, used := be.Reserved()
		if h, _ := f.held(); h != int(pooled)-used+size {
			t.Fatalf("%d host bytes allocated, %d pooled (%d of them in the %d-byte arena)", h, pooled, used, size)
		}
		closeFreesAll(t, be, f)
	}
}

// A class's macro in RMSGRAD_CUDA_NVRTC_OPTS reaches only the programs
// holding that class, so a variant recompiles them alone; any other option
// reaches every program.
func TestCompileOptsPerClass(t *testing.T) {
	t.Setenv("RMSGRAD_CUDA_NVRTC_OPTS", "-DRMS_C1_S=2 -DRMS_C8_MINB=2 -DRMS_C10_S=2 -DRMS_VOLATILE_LOADS")
	b := &Backend{arch: "sm_90"}
	has := func(opts []string, o string) bool { return slices.Contains(opts, o) }
	seen := map[string]int{}
	for p := range kernelParts() {
		opts := b.compileOpts(p)
		if !has(opts, "-DRMS_VOLATILE_LOADS") {
			t.Errorf("part %d: %v lacks the option of every part", p, opts)
		}
		if has(opts, "-DRMS_C1_S=2") != partHoldsClass(p, 1) || has(opts, "-DRMS_C8_MINB=2") != partHoldsClass(p, 8) || has(opts, "-DRMS_C10_S=2") != partHoldsClass(p, 10) {
			t.Errorf("part %d (%v): options %v", p, kernelParts()[p], opts)
		}
		for _, o := range opts {
			seen[o]++
		}
	}
	// c1 is one program; c8 and c10 two each (their BF16 and F16 kernels).
	if seen["-DRMS_C1_S=2"] != 1 || seen["-DRMS_C8_MINB=2"] != 2 || seen["-DRMS_C10_S=2"] != 2 {
		t.Errorf("class options reached %d, %d and %d programs, want 1, 2 and 2", seen["-DRMS_C1_S=2"], seen["-DRMS_C8_MINB=2"], seen["-DRMS_C10_S=2"])
	}
	for _, o := range []string{"-DRMS_C_S=1", "-DRMS_CX_S=1", "-DRMS_C12", "-DRMS_PART=1", "-DRMS_C100_S=1", "-DRMS_C1x_S=1"} {
		if _, ok := optClass(o); ok {
			t.Errorf("optClass(%q) took it for a class option", o)
		}
	}
}

// The reduce's macros reach only part 1, which holds the reduce; the
// trigger and the partials probe only the fused classes' programs (parts
// 2 and up), so neither recompiles the general kernel.
func TestCompileOptsReduceAndFused(t *testing.T) {
	t.Setenv("RMSGRAD_CUDA_NVRTC_OPTS", "-DRMS_RED_U=16 -DRMS_PDL_TRIGGER=1 -DRMS_NARROW8=1 -DRMS_PART_SKIP")
	b := &Backend{arch: "sm_90"}
	for p := range kernelParts() {
		opts := b.compileOpts(p)
		if got := slices.Contains(opts, "-DRMS_RED_U=16"); got != (p == 1) {
			t.Errorf("part %d (%v): -DRMS_RED_U=16 in its options %v, want %v", p, kernelParts()[p], got, p == 1)
		}
		for _, o := range []string{"-DRMS_PDL_TRIGGER=1", "-DRMS_NARROW8=1", "-DRMS_PART_SKIP"} {
			if got := slices.Contains(opts, o); got != (p >= 2) {
				t.Errorf("part %d (%v): %s in its options %v, want %v", p, kernelParts()[p], o, got, p >= 2)
			}
		}
	}
	if opts := b.compileOpts(-1); !slices.Contains(opts, "-DRMS_RED_U=16") || !slices.Contains(opts, "-DRMS_PART_SKIP") {
		t.Errorf("the whole source (part -1) lacks an option: %v", opts)
	}
}

// RMSGRAD_CUDA_CLASS_GEOM's items change one class each and keep its dims.
func TestParseClassGeom(t *testing.T) {
	classes := append([]fusedClass(nil), fusedClasses[:]...)
	opts, err := parseClassGeom("0:8x32x8,7:1x256x3,4:2x640x1", classes)
	if err != nil {
		t.Fatal(err)
	}
	if c := classes[0]; c.k != 8 || c.maxThreads != 32 || c.minBlocks != 8 || c.maxNch != fusedClasses[0].maxNch {
		t.Errorf("class 0 after the variant: %+v", c)
	}
	if c := classes[7]; c.k != 1 || c.maxThreads != 256 || c.minBlocks != 3 {
		t.Errorf("class 7 after the variant: %+v", c)
	}
	// c4's blocks hold more than its widest row (1088 chunks, 4 a thread
	// in up to 320 threads): the variant keeps K*T and the dims.
	if c := classes[4]; c.k != 2 || c.maxThreads != 640 || c.minBlocks != 1 || c.maxNch != fusedClasses[4].maxNch {
		t.Errorf("class 4 after the variant: %+v", c)
	}
	if classes[1] != fusedClasses[1] {
		t.Errorf("class 1 changed: %+v", classes[1])
	}
	if want := []string{"-DRMS_C0_K=8", "-DRMS_C0_MAXT=32", "-DRMS_C0_MINB=8"}; !slices.Equal(opts[0], want) {
		t.Errorf("class 0 options %v, want %v", opts[0], want)
	}
	if len(opts) != 3 {
		t.Errorf("options for %d classes, want 3", len(opts))
	}
	// "/N" moves a class's end: c1 to 1920 (480 chunks), 2048 to c2.
	moved := append([]fusedClass(nil), fusedClasses[:]...)
	if _, err := parseClassGeom("1:2x256x3/480", moved); err != nil {
		t.Fatal(err)
	}
	if moved[1].maxNch != 480 || moved[1].k != 2 || moved[1].maxThreads != 256 {
		t.Errorf("class 1 after 1:2x256x3/480: %+v", moved[1])
	}
	// "9:4x256x2/1024" gives c9 every half dim over 4096 again (c10 and c11
	// take none), the geometry before c10; "7:2x128x4/256" c7 every half
	// dim up to 2048 (c12 takes none), the geometry before c12 (the next
	// device call's baseline).
	back := append([]fusedClass(nil), fusedClasses[:]...)
	if _, err := parseClassGeom("9:4x256x2/1024,7:2x128x4/256", back); err != nil {
		t.Fatal(err)
	}
	if back[9].maxNch != 1024 || back[9] == fusedClasses[9] || back[7].maxNch != 256 {
		t.Errorf("after 9:4x256x2/1024,7:2x128x4/256: c7 %+v, c9 %+v", back[7], back[9])
	}
	for _, c := range []struct{ dim, class, was int }{{1152, 7, 12}, {2048, 7, 12}, {1024, 7, 7}, {5248, 9, 10}, {8192, 9, 11}, {2176, 8, 8}} {
		if got, _ := classIn(back, c.dim, 8); got != c.class {
			t.Errorf("half dim %d after the variant: class %d, want %d", c.dim, got, c.class)
		}
		if got, _ := classOf(c.dim, 8); got != c.was {
			t.Errorf("half dim %d by default: class %d, want %d", c.dim, got, c.was)
		}
	}
	// A final "s" moves w and the dw sums to shared memory, "r" to registers.
	ws := append([]fusedClass(nil), fusedClasses[:]...)
	wopts, err := parseClassGeom("7:2x128x6s,8:2x256x3r,9:4x256x2/768s", ws)
	if err != nil {
		t.Fatal(err)
	}
	if !ws[7].ws || ws[7].minBlocks != 6 || ws[8].ws || !ws[9].ws || ws[9].maxNch != 768 {
		t.Errorf("after 7:2x128x6s,8:2x256x3r,9:4x256x2/768s: c7 %+v, c8 %+v, c9 %+v", ws[7], ws[8], ws[9])
	}
	if !slices.Contains(wopts[7], "-DRMS_C7_WS=2") || !slices.Contains(wopts[8], "-DRMS_C8_WS=0") || !slices.Contains(wopts[9], "-DRMS_C9_WS=2") {
		t.Errorf("options %v", wopts)
	}
	plain := append([]fusedClass(nil), fusedClasses[:]...)
	if popts, err := parseClassGeom("7:2x128x4,8:2x256x3", plain); err != nil || plain[7].ws || !plain[8].ws || slices.ContainsFunc(append(popts[7], popts[8]...), func(o string) bool { return strings.Contains(o, "_WS") }) {
		t.Errorf("without a final s or r: %v, c7 %+v, c8 %+v, options %v (want each class's own)", err, plain[7], plain[8], popts)
	}
	for _, bad := range []string{"7:2x128x4ss", "7:2x128x4x", "7:2x128x4 s", "7:2x128x4/s", "s", "1:2x256x3/513", "1:2x256x3/0", "1:2x256x3/", "1:2x256x3/x", "0:8x64x8", "4:4x304x2", "4:2x608x2", "0:9x32x8", "10:1x256x3", "0:8x33x8", "0:8x32x0", "0:8x32", "x"} {
		if _, err := parseClassGeom(bad, append([]fusedClass(nil), fusedClasses[:]...)); !errors.Is(err, compute.ErrUnsupported) {
			t.Errorf("parseClassGeom(%q): %v, want an error", bad, err)
		}
	}
	if o, err := parseClassGeom("", classes); o != nil || err != nil {
		t.Errorf("empty: %v, %v", o, err)
	}
}

// A buffer of at most mapMax bytes, which the kernels reach through its
// pinned host memory's mapping, gets no device memory when allocated; devMem
// (a benchmark's copy mode, the job table taken from the pool) adds it once
// and Close frees it. Larger buffers get theirs at once.
func TestMappedBuffersNoDeviceMemory(t *testing.T) {
	be, f := newFakeBackend(t)
	be.mapMax = 1 << 20
	small, err := be.Alloc(compute.F32, 8, 1024) // 32 KiB
	if err != nil {
		t.Fatal(err)
	}
	if _, dev := f.held(); dev != 0 {
		t.Fatalf("a 32 KiB buffer (map bytes 1 MiB) took %d device bytes; want none", dev)
	}
	large, err := be.Alloc(compute.F32, 1<<19) // 2 MiB
	if err != nil {
		t.Fatal(err)
	}
	_, dev := f.held()
	if dev != sizeClass(2<<20) {
		t.Fatalf("a 2 MiB buffer: %d device bytes; want %d", dev, sizeClass(2<<20))
	}
	unlock, err := be.bindCtx()
	if err != nil {
		t.Fatal(err)
	}
	m := small.(*buffer).m
	for range 2 { // the second call allocates nothing
		if err := be.devMem(m); err != nil {
			t.Fatal(err)
		}
		if _, d := f.held(); d != dev+m.size || m.dptr == 0 {
			t.Fatalf("after devMem: %d device bytes (dptr %#x); want %d", d, m.dptr, dev+m.size)
		}
	}
	// The job table from the pool: a released small buffer with no device
	// memory gets some.
	other, err := be.Alloc(compute.F32, 4, 1024)
	if err != nil {
		t.Fatal(err)
	}
	om := other.(*buffer).m
	if om.dptr != 0 {
		t.Fatalf("a 16 KiB buffer has device memory %#x", om.dptr)
	}
	other.Release()
	if err := be.ensure(&be.table, 16<<10, true); err != nil {
		t.Fatal(err)
	}
	if be.table != om || be.table.dptr == 0 {
		t.Fatalf("the job table: %p with dptr %#x; want the pooled buffer %p, given device memory", be.table, be.table.dptr, om)
	}
	// Out of device memory: the error names the size.
	third, err := be.Alloc(compute.F32, 2, 1024)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.failDev = true
	f.mu.Unlock()
	if err := be.devMem(third.(*buffer).m); err == nil || !strings.Contains(err.Error(), "8192 device bytes") {
		t.Fatalf("devMem out of device memory: %v; want an error naming 8192 device bytes", err)
	}
	f.mu.Lock()
	f.failDev = false
	f.mu.Unlock()
	unlock()
	for _, x := range []compute.Buffer{small, large, third} {
		x.Release()
	}
	closeFreesAll(t, be, f)
}
