package cuda

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/shaders"
)

// Backend runs command buffers on one CUDA device (ordinal 0). It is safe for
// concurrent use: Execute calls are serialized on the backend's one stream.
type Backend struct {
	d      *driverAPI
	nv     *nvrtcAPI
	dev    int32
	ctx    uintptr
	device string
	arch   string
	sms    int
	// Geometry knobs (geometry): forced blocks per multiprocessor (0:
	// chosen per dim), most shared-memory row slots (0: the register
	// paths), the per-block shared memory limit.
	perSM, maxStages int
	smemOptin        int32
	// halfSlots: class c9 compiled with x and dy in this many shared-memory
	// slots, halfSlotsR rows a barrier (RMSGRAD_CUDA_HALF_SLOTS; 0: rows in
	// registers, the default).
	halfSlots, halfSlotsR int
	// maxPerSM caps the blocks per SM of the fused classes (default
	// maxBlocksPerSM; RMSGRAD_CUDA_MAX_BLOCKS_PER_SM, a benchmark variant
	// for classes of small blocks: RMSGRAD_CUDA_CLASS_GEOM).
	maxPerSM int
	// rgAlign rounds each job's rows per group up to a multiple of it when
	// that adds at most 2% (groups); 0 or 1: off.
	rgAlign int
	// pdl: the dw reduction is launched as a programmatic dependent launch
	// of the rows kernel before it (sm_90 and later, a driver with
	// cuLaunchKernelEx), which hides the launch gap between the two.
	pdl bool
	// noReduce (RMSGRAD_CUDA_PROBE_NO_REDUCE=1, a benchmark probe) skips
	// the dw reduce launch: dw is then wrong, and the rows kernels are
	// timed alone.
	noReduce bool

	// classes is the fused class table of this device (applyProfile):
	// fusedClasses with the device profile's geometry; classOpts the
	// profile's -DRMS_Cc_K/_MAXT/_MINB options by class; profile nil for
	// the defaults.
	classes   []fusedClass
	classOpts map[int][]string
	profile   *deviceProfile

	// mapMax: buffers of at most this many bytes are read and written by
	// the kernels in their pinned host memory (mapped into the device's
	// address space) instead of being copied (RMSGRAD_CUDA_MAP_BYTES).
	mapMax int
	// occ[c][t/32-1] is how many blocks of t threads of fused class c fit
	// on a multiprocessor (the driver's occupancy of the compiled kernel).
	occ [][]int

	mods                            []uintptr // one module per NVRTC program (kernelParts)
	fnRows                          []uintptr // rows kernels, by kRows, kFused0+class
	fnReduce, fnAdd, fnSpin, fnFill uintptr
	stream                          uintptr
	evStart, evEnd                  uintptr
	evK0, evK1                      uintptr // around the kernels, for Stats
	args                            *launchArgs

	mu      sync.Mutex // guards everything below and serializes Execute
	scratch *mem       // dw partials, device only
	table   *mem       // job table, pinned host + device
	// launches, rowsLaunches and last are reused by Execute.
	launches     []phaseLaunch
	rowsLaunches []rowsLaunch
	last         Stats
	// poolMu guards the pool and closed (written under both locks):
	// Alloc and Release take only poolMu, so the handlers' buffers come and
	// go while a command buffer runs.
	poolMu sync.Mutex
	pool   map[int][]*mem
	allocs atomic.Int64 // cuMemAlloc calls, for the steady-state test
	closed bool
	// limit (PoolLimit; 0: none) bounds live+pooledBytes, the bytes of
	// the buffers outside the arena handed out and kept in the pool (size
	// classes). Arena pieces are counted apart (arenaLive, arenaPooled):
	// they are never freed alone (the arena is freed whole at Close), so
	// counting them against the limit would leave an old shape's pieces
	// holding it and a new shape's buffers pinned and freed job by job.
	limit, live, pooledBytes int64
	arenaLive, arenaPooled   int64
	// growing counts Alloc's new allocations, and the frees of buffers the
	// limit does not keep, made outside poolMu (pinning tens of MiB takes
	// milliseconds, and a worker warming up makes many at once); Close
	// waits on grown until none is left. allocLocked
	// (RMSGRAD_CUDA_ALLOC_LOCKED=1, a benchmark variant) allocates under
	// poolMu instead, one allocation at a time.
	growing     int
	grown       sync.Cond // L is &poolMu
	allocLocked bool
	// The arena is pinned host memory reserved in one call (Reserve),
	// from which newMem carves the pinned part of its allocations until
	// it is used up: a fresh worker's pool then fills without pinning
	// buffer by buffer. Carved memory goes to the pool like any other and
	// the arena is freed whole at Close. arenaMu guards arenaUsed.
	arenaMu   sync.Mutex
	arenaHost unsafe.Pointer
	arenaDev  uint64
	arenaSize int
	arenaUsed int
	// hold, when set (benchmarks only), queues a kernel spinning that long
	// before the timed region of Execute, so that the kernels' events do
	// not include the host's launch latency.
	hold time.Duration
	// CompileTime is how long NVRTC took at Open.
	compile time.Duration
	// selfCheckTime is how long Open's self-check took (0: skipped).
	selfCheckTime time.Duration
}

// mem is one pooled allocation: pinned host memory and device memory of the
// same size (host is nil for device-only scratch). hdev is the host
// memory's address in the device's address space (the kernels read and
// write small buffers there, with no copies). A buffer of at most mapMax
// bytes gets no device memory when it is allocated (dptr 0: the kernels
// use hdev); devMem adds it the first time one is copied (a benchmark's
// copy mode, or the job table).
type mem struct {
	host unsafe.Pointer
	hdev uint64
	dptr uint64
	size int
	// arena: host lies in the backend's arena (freed with it, not alone).
	arena bool
}

// arenaAlign aligns the arena's pieces as cuMemAlloc aligns its own.
const arenaAlign = 256

// Reserve pins n bytes of host memory (mapped into the device's address
// space and zeroed) in one allocation, from which the buffer pool takes
// its new buffers until it is used up, so that the first jobs of a fresh
// worker do not pin their buffers one by one (tens of MiB each, some
// milliseconds). Buffers beyond it are pinned as they are needed, as
// without a reserve. Call it once, before the first Alloc; n <= 0 is a
// no-op. It returns how long pinning and zeroing took.
func (b *Backend) Reserve(n int64) (time.Duration, error) {
	if n <= 0 {
		return 0, nil
	}
	n = (n + arenaAlign - 1) &^ (arenaAlign - 1)
	start := time.Now()
	b.poolMu.Lock()
	defer b.poolMu.Unlock()
	if b.closed {
		return 0, fmt.Errorf("cuda: Reserve after Close: %w", compute.ErrDevice)
	}
	b.arenaMu.Lock()
	defer b.arenaMu.Unlock()
	if b.arenaHost != nil {
		return 0, fmt.Errorf("cuda: Reserve called twice: %w", compute.ErrInvalidArgument)
	}
	unlock, err := b.bindCtx()
	if err != nil {
		return 0, err
	}
	defer unlock()
	var host unsafe.Pointer
	if err := b.d.check("cuMemHostAlloc", b.d.cuMemHostAlloc(&host, uintptr(n), memHostAllocPortab|memHostAllocDevMap)); err != nil {
		return 0, fmt.Errorf("cuda: reserving %d pinned host bytes: %w", n, err)
	}
	var hdev uint64
	if err := b.d.check("cuMemHostGetDevicePointer", b.d.cuMemHostGetDevicePtr(&hdev, host, 0)); err != nil {
		b.d.cuMemFreeHost(host)
		return 0, fmt.Errorf("cuda: mapping %d reserved pinned host bytes: %w", n, err)
	}
	clearParallel(unsafe.Slice((*byte)(host), n))
	b.arenaHost, b.arenaDev, b.arenaSize = host, hdev, int(n)
	return time.Since(start), nil
}

// Reserved returns the arena's size and how much of it the pool has taken.
func (b *Backend) Reserved() (size, used int) {
	b.arenaMu.Lock()
	defer b.arenaMu.Unlock()
	return b.arenaSize, b.arenaUsed
}

// arenaTake carves c bytes off the arena: their host and device addresses,
// or ok false when the arena is missing or too short.
func (b *Backend) arenaTake(c int) (host unsafe.Pointer, hdev uint64, ok bool) {
	b.arenaMu.Lock()
	defer b.arenaMu.Unlock()
	c = (c + arenaAlign - 1) &^ (arenaAlign - 1)
	if b.arenaHost == nil || b.arenaSize-b.arenaUsed < c {
		return nil, 0, false
	}
	off := b.arenaUsed
	b.arenaUsed += c
	return unsafe.Add(b.arenaHost, off), b.arenaDev + uint64(off), true
}

// clearParallel zeroes p on up to GOMAXPROCS goroutines (a reserve of
// gigabytes takes a core a few hundred milliseconds to clear).
func clearParallel(p []byte) {
	const chunk = 64 << 20
	if len(p) <= chunk {
		clear(p)
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for len(p) > 0 {
		q := p[:min(chunk, len(p))]
		p = p[len(q):]
		sem <- struct{}{}
		wg.Go(func() {
			clear(q)
			<-sem
		})
	}
	wg.Wait()
}

// defaultMapMax is the backend's mapMax: buffers up to 1 MiB (a small or
// medium job's tensors) are not copied.
const defaultMapMax = 1 << 20

// Open loads the driver and NVRTC, picks device 0, compiles the kernels for
// its architecture and returns the backend. Without a driver, a device or
// NVRTC it returns an error wrapping compute.ErrUnsupported saying which.
// Options (PoolLimit) configure the buffer pool.
func Open(opts ...Option) (compute.Backend, error) { return open(opts...) }

// Option configures Open.
type Option func(*Backend)

// PoolLimit bounds the backend's buffers, in use and kept for reuse
// together, to n bytes (pinned host memory, with device memory of the same
// size): a released buffer that would take the total over it is freed
// instead of pooled, and pooled buffers of other size classes are freed
// before a new buffer would take the total over it. A worker passes its
// memory budget with slack (cmd/worker), so buffers of shapes it no longer
// sees do not stay pinned. Pieces of the Reserve arena are not counted:
// they stay pooled (the arena is freed whole at Close), so the pool holds
// at most the arena plus n. 0 (the default) keeps
// every released buffer until Close. Buffers in use are never taken back:
// a new buffer is allocated even when nothing pooled is left to free.
func PoolLimit(n int64) Option { return func(b *Backend) { b.limit = max(n, 0) } }

// newBackend is a Backend on driver d, before Open's device set-up.
func newBackend(d *driverAPI, opts ...Option) *Backend {
	b := &Backend{d: d, pool: make(map[int][]*mem), args: new(launchArgs)}
	b.grown.L = &b.poolMu
	for _, o := range opts {
		o(b)
	}
	return b
}

func open(opts ...Option) (*Backend, error) {
	d, err := loadDriver()
	if err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := d.cuInit(0); r != 0 {
		e := &DriverError{Call: "cuInit", Code: int(r), Name: d.errName(r), kind: compute.ErrUnsupported}
		return nil, fmt.Errorf("cuda: driver present but unusable (no GPU visible?): %w", e)
	}
	var n int32
	if err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
		return nil, fmt.Errorf("%w (%w)", err, compute.ErrUnsupported)
	}
	if n == 0 {
		return nil, fmt.Errorf("cuda: the driver sees no GPU: %w", compute.ErrUnsupported)
	}
	b := newBackend(d, opts...)
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&b.dev, 0)); err != nil {
		return nil, err
	}
	var name [256]byte
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), b.dev)); err != nil {
		return nil, err
	}
	var major, minor, sms int32
	for _, a := range []struct {
		v    *int32
		attr int32
	}{{&major, attrComputeCapMajor}, {&minor, attrComputeCapMinor}, {&sms, attrMultiprocessorCount}, {&b.smemOptin, attrMaxSmemOptin}} {
		if err := d.check("cuDeviceGetAttribute", d.cuDeviceGetAttribute(a.v, a.attr, b.dev)); err != nil {
			return nil, err
		}
	}
	b.arch = fmt.Sprintf("sm_%d%d", major, minor)
	b.sms = int(sms)
	b.perSM, b.maxStages = 0, 0
	if v, err := strconv.Atoi(os.Getenv("RMSGRAD_CUDA_BLOCKS_PER_SM")); err == nil && v > 0 {
		b.perSM = v
	}
	b.maxPerSM = maxBlocksPerSM
	if v, err := strconv.Atoi(os.Getenv("RMSGRAD_CUDA_MAX_BLOCKS_PER_SM")); err == nil && v > 0 {
		b.maxPerSM = v
	}
	if v, err := strconv.Atoi(os.Getenv("RMSGRAD_CUDA_STAGES")); err == nil && v >= 0 {
		b.maxStages = min(v, 4)
	}
	if b.halfSlots, b.halfSlotsR, err = halfSlotsEnv(); err != nil {
		return nil, err
	}
	if err := applyClassGeom(); err != nil {
		return nil, err
	}
	devName := strings.TrimRight(string(name[:]), "\x00")
	prof, err := profileFor(devName, os.Getenv("RMSGRAD_CUDA_PROFILE"))
	if err != nil {
		return nil, err
	}
	if err := b.applyProfile(prof); err != nil {
		return nil, err
	}
	b.rgAlign = defaultRGAlign
	if v, err := strconv.Atoi(os.Getenv("RMSGRAD_CUDA_RG_ALIGN")); err == nil && v >= 0 {
		b.rgAlign = v
	}
	b.pdl = major >= 9 && d.cuLaunchKernelEx != nil && os.Getenv("RMSGRAD_CUDA_PDL") != "0"
	b.noReduce = os.Getenv("RMSGRAD_CUDA_PROBE_NO_REDUCE") == "1"
	if v := os.Getenv("RMSGRAD_CUDA_RED_CH"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || (n != 1 && n != 2 && n != 4 && n != 8) {
			return nil, fmt.Errorf("cuda: RMSGRAD_CUDA_RED_CH=%q: want 1, 2, 4 or 8", v)
		}
		redChunks = n
	}
	b.allocLocked = os.Getenv("RMSGRAD_CUDA_ALLOC_LOCKED") == "1"
	b.mapMax = defaultMapMax
	if v, err := strconv.Atoi(os.Getenv("RMSGRAD_CUDA_MAP_BYTES")); err == nil && v >= 0 {
		b.mapMax = v
	}
	b.device = fmt.Sprintf("%s (%s)", devName, b.arch)
	if b.profile != nil {
		b.device = fmt.Sprintf("%s (%s, geometry %s)", devName, b.arch, b.profile.name)
	}

	nv, _, err := loadNVRTC()
	if err != nil {
		return nil, err
	}
	b.nv = nv
	t0 := time.Now()
	cubins, fromDisk, err := b.cachedKernels(false)
	if err != nil {
		return nil, err
	}
	b.compile = time.Since(t0)

	if f, ok := syncFlags[os.Getenv("RMSGRAD_CUDA_SYNC")]; ok && f != ctxSchedAuto {
		if err := d.check("cuDevicePrimaryCtxSetFlags", d.cuDevicePrimaryCtxFlags(b.dev, f)); err != nil {
			return nil, err
		}
	}
	if err := d.check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&b.ctx, b.dev)); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			b.destroy()
		}
	}()
	if err := d.check("cuCtxSetCurrent", d.cuCtxSetCurrent(b.ctx)); err != nil {
		return nil, err
	}
	if err := b.loadModules(cubins); err != nil {
		if !fromDisk {
			return nil, err
		}
		// A damaged or foreign file in the cache: compile afresh.
		if cubins, _, err = b.cachedKernels(true); err != nil {
			return nil, err
		}
		b.compile = time.Since(t0)
		if err := b.loadModules(cubins); err != nil {
			return nil, err
		}
	}
	fns := map[string]*uintptr{shaders.CUDARowsKernel: nil, shaders.CUDAReduceKernel: &b.fnReduce,
		shaders.CUDAAddKernel: &b.fnAdd, shaders.CUDASpinKernel: &b.fnSpin, shaders.CUDAFillKernel: &b.fnFill}
	b.fnRows = make([]uintptr, nKernels)
	fns[shaders.CUDARowsKernel] = &b.fnRows[kRows]
	for k := kFused0; k < nKernels; k++ {
		fns[fusedKernelName(k)] = &b.fnRows[k]
	}
	for p, names := range kernelParts() {
		for _, name := range names {
			if err := d.check("cuModuleGetFunction("+name+")", d.cuModuleGetFunction(fns[name], b.mods[p], name)); err != nil {
				return nil, err
			}
		}
	}
	// Classes that keep w and the dw sums in shared memory may need more
	// than the default 48 KiB of it (c9: 64 KiB at 8192).
	for c, fc := range b.classTable() {
		if n := b.classSmem(c, fc.maxDim(fc.maxThreads)); n > 0 {
			for _, k := range classKernels(c) {
				if err := d.check("cuFuncSetAttribute(max dynamic shared memory of "+fusedKernelName(k)+")", d.cuFuncSetAttribute(b.fnRows[k], funcAttrMaxDynSmem, int32(n))); err != nil {
					return nil, err
				}
			}
		}
	}
	// Occupancy of each fused class at every block size it may run with:
	// the fewer of a half class's two kernels, so that the groups of a
	// shape do not depend on its dtype's kernel.
	b.occ = make([][]int, len(b.classTable()))
	for c, fc := range b.classTable() {
		b.occ[c] = make([]int, fc.maxThreads/32)
		for i := range b.occ[c] {
			for j, k := range classKernels(c) {
				var n int32
				if err := d.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", d.cuOccupancyMaxBlocks(&n, b.fnRows[k], int32(32*(i+1)), uintptr(b.classSmem(c, fc.maxDim(32*(i+1)))))); err != nil {
					return nil, err
				}
				if j == 0 || int(n) < b.occ[c][i] {
					b.occ[c][i] = int(n)
				}
			}
		}
	}
	if b.smemOptin > 0 {
		if err := d.check("cuFuncSetAttribute(max dynamic shared memory)", d.cuFuncSetAttribute(b.fnRows[kRows], funcAttrMaxDynSmem, b.smemOptin-smemReserve)); err != nil {
			return nil, err
		}
	}
	if err := d.check("cuStreamCreate", d.cuStreamCreate(&b.stream, streamNonBlocking)); err != nil {
		return nil, err
	}
	for _, e := range []*uintptr{&b.evStart, &b.evEnd, &b.evK0, &b.evK1} {
		if err := d.check("cuEventCreate", d.cuEventCreate(e, eventDefault)); err != nil {
			return nil, err
		}
	}
	if err := b.selfCheck(context.Background()); err != nil {
		return nil, err
	}
	ok = true
	return b, nil
}

// syncFlags maps RMSGRAD_CUDA_SYNC to the primary context's scheduling
// flags: how cuStreamSynchronize waits for the GPU (spinning on a core,
// yielding it, or sleeping on an interrupt). Unset or "auto": the driver's
// choice (spinning while the process has fewer contexts than cores).
var syncFlags = map[string]uint32{"": ctxSchedAuto, "auto": ctxSchedAuto, "spin": ctxSchedSpin, "yield": ctxSchedYield, "block": ctxSchedBlock}

// kernelParts lists the kernels of each NVRTC program: the source is
// compiled as len(kernelParts()) programs at once (RMS_PART n keeps the
// kernels of part n), each on its own thread, since NVRTC takes tens of
// seconds over all of them on one.
func kernelParts() [][]string {
	parts := [][]string{{shaders.CUDARowsKernel}, {shaders.CUDAReduceKernel, shaders.CUDAAddKernel, shaders.CUDASpinKernel, shaders.CUDAFillKernel}}
	for _, name := range shaders.CUDARowsFusedKernels {
		parts = append(parts, []string{name})
	}
	for _, name := range shaders.CUDARowsFusedF16Kernels {
		parts = append(parts, []string{name})
	}
	return parts
}

// loadModules loads one module per part's cubin.
func (b *Backend) loadModules(cubins [][]byte) error {
	for _, m := range b.mods {
		b.d.cuModuleUnload(m)
	}
	b.mods = make([]uintptr, len(cubins))
	for p, c := range cubins {
		if err := b.d.check("cuModuleLoadData", b.d.cuModuleLoadData(&b.mods[p], unsafe.Pointer(&c[0]))); err != nil {
			return fmt.Errorf("cuda: loading part %d of the kernels: %w", p, err)
		}
		runtime.KeepAlive(c)
	}
	return nil
}

// cubins holds the kernels compiled in this process, by part, architecture
// and NVRTC options: a second Open (the tests open a backend per case)
// reuses them instead of compiling again.
var cubins struct {
	sync.Mutex
	m map[string][]byte
}

// cubinCacheDir is where compiled kernels are kept between processes:
// RMSGRAD_CUDA_CACHE, a directory or "off", else rmsgrad/cuda under the
// user's cache directory; "" when there is none.
func cubinCacheDir() string {
	if v := os.Getenv("RMSGRAD_CUDA_CACHE"); v != "" {
		if v == "off" {
			return ""
		}
		return v
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "rmsgrad", "cuda")
}

// cachedKernels returns the cubin of each part (kernelParts) for b.arch and
// the NVRTC options of the environment: from this process's earlier Open,
// else from the cache directory (a file named by the hash of the source,
// the part, the architecture, the options and NVRTC's version), else
// compiled (the missing parts at once) and stored there. fresh skips the
// cache directory (a cubin from it that the driver refused); fromDisk says
// whether any part came from it.
func (b *Backend) cachedKernels(fresh bool) (out [][]byte, fromDisk bool, err error) {
	var major, minor int32
	b.nv.nvrtcVersion(&major, &minor)
	parts := kernelParts()
	keys := make([]string, len(parts))
	for p := range parts {
		opts := strings.Join(b.compileOpts(p), " ")
		h := sha256.New()
		fmt.Fprintf(h, "rmsgrad cubin 1\x00%d\x00%s\x00%s\x00%d.%d\x00", p, b.arch, opts, major, minor)
		io.WriteString(h, shaders.CUDASource)
		keys[p] = hex.EncodeToString(h.Sum(nil))[:32]
	}
	cubins.Lock()
	defer cubins.Unlock()
	if cubins.m == nil {
		cubins.m = map[string][]byte{}
	}
	dir := cubinCacheDir()
	out = make([][]byte, len(parts))
	var missing []int
	for p, key := range keys {
		if c, ok := cubins.m[key]; ok && !fresh {
			out[p] = c
			continue
		}
		if dir != "" && !fresh {
			if c, err := os.ReadFile(filepath.Join(dir, key+".cubin")); err == nil && len(c) > 0 {
				out[p], fromDisk = c, true
				cubins.m[key] = c
				continue
			}
		}
		missing = append(missing, p)
	}
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for _, p := range missing {
		wg.Go(func() { out[p], errs[p] = b.compileKernels(p) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, false, err
	}
	for _, p := range missing {
		cubins.m[keys[p]] = out[p]
		if dir != "" {
			storeCubin(dir, keys[p], out[p])
		}
	}
	return out, fromDisk, nil
}

// storeCubin writes c as dir/key.cubin, best effort: a cache that cannot be
// written costs the next process a compile, nothing else.
func storeCubin(dir, key string, c []byte) {
	if os.MkdirAll(dir, 0o755) != nil {
		return
	}
	f, err := os.CreateTemp(dir, key+".*.tmp")
	if err != nil {
		return
	}
	_, werr := f.Write(c)
	if cerr := f.Close(); werr == nil && cerr == nil {
		_ = os.Rename(f.Name(), filepath.Join(dir, key+".cubin"))
	}
	_ = os.Remove(f.Name())
}

// compileOpts are NVRTC's options for part p of the kernels for b.arch (no
// RMS_PART option for p < 0).
func (b *Backend) compileOpts(p int) []string {
	opts := []string{"--gpu-architecture=" + b.arch, "--std=c++17", "-lineinfo"}
	if p >= 0 {
		opts = append(opts, fmt.Sprintf("-DRMS_PART=%d", p))
	}
	// Class c9's slots, in the program that holds c9 (the others keep
	// their cached cubins).
	if b.halfSlots > 0 && (p < 0 || partHoldsClass(p, halfSlotsClass)) {
		opts = append(opts, fmt.Sprintf("-DRMS_C9_SLOTS=%d", b.halfSlots), fmt.Sprintf("-DRMS_C9_SLOTS_R=%d", b.halfSlotsR))
	}
	// The reduce's columns a block, in the program that holds it.
	if redChunks != 8 && (p < 0 || p == 1) {
		opts = append(opts, fmt.Sprintf("-DRMS_RED_CH=%d", redChunks))
	}
	// RMSGRAD_CUDA_CLASS_GEOM's classes and the device profile's, in the
	// programs that hold them.
	for c := range fusedClasses {
		if o, ok := classGeom.opts[c]; ok && (p < 0 || partHoldsClass(p, c)) {
			opts = append(opts, o...)
		}
		if o, ok := b.classOpts[c]; ok && (p < 0 || partHoldsClass(p, c)) {
			opts = append(opts, o...)
		}
	}
	// The profile's class macros, in the programs that hold their class,
	// unless RMSGRAD_CUDA_NVRTC_OPTS defines the same macro (a variant).
	var profOpts []string
	if b.profile != nil {
		profOpts = b.profile.opts
	}
	envOpts := strings.Fields(os.Getenv("RMSGRAD_CUDA_NVRTC_OPTS"))
	for _, o := range profOpts {
		if k, ok := optClass(o); ok && p >= 0 && !partHoldsClass(p, k) {
			continue
		}
		macro, _, _ := strings.Cut(o, "=")
		if slices.ContainsFunc(envOpts, func(e string) bool { m, _, _ := strings.Cut(e, "="); return m == macro }) {
			continue
		}
		opts = append(opts, o)
	}
	// RMSGRAD_CUDA_NVRTC_OPTS adds options (space-separated), e.g.
	// -DRMS_PF_KMAX=0 to compare kernel variants in one benchmark run. An
	// option naming one fused class's macro (-DRMS_C<k>_...) goes only to
	// the programs that hold class k, so that a variant recompiles those
	// and the others keep their cached cubins (the general kernel alone
	// takes NVRTC tens of seconds).
	// Likewise the reduce's macros (-DRMS_RED_...) go only to part 1, which
	// holds the reduce, and -DRMS_PDL_TRIGGER, -DRMS_NARROW8 and the
	// -DRMS_PART_SKIP probe only to the fused classes'.
	for _, o := range strings.Fields(os.Getenv("RMSGRAD_CUDA_NVRTC_OPTS")) {
		if k, ok := optClass(o); ok && p >= 0 && !partHoldsClass(p, k) {
			continue
		}
		if strings.HasPrefix(o, "-DRMS_RED_") && p >= 0 && p != 1 {
			continue
		}
		if (strings.HasPrefix(o, "-DRMS_PDL_TRIGGER") || strings.HasPrefix(o, "-DRMS_NARROW8") || strings.HasPrefix(o, "-DRMS_PART_SKIP")) && p >= 0 && p < 2 {
			continue
		}
		opts = append(opts, o)
	}
	return opts
}

// optClass returns k for an option -DRMS_C<k>_... (a fused class's macro).
func optClass(o string) (int, bool) {
	rest, ok := strings.CutPrefix(o, "-DRMS_C")
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "_")
	if !ok || digits == "" || len(digits) > 2 || strings.Trim(digits, "0123456789") != "" {
		return 0, false
	}
	k, err := strconv.Atoi(digits)
	return k, err == nil
}

// partHoldsClass reports whether NVRTC program p holds a kernel of fused
// class k (its BF16/F32 kernel or, for a half class, its F16 kernel).
func partHoldsClass(p, k int) bool {
	return slices.ContainsFunc(kernelParts()[p], func(n string) bool {
		if k < len(shaders.CUDARowsFusedKernels) && n == shaders.CUDARowsFusedKernels[k] {
			return true
		}
		return k >= firstHalfClass && k-firstHalfClass < len(shaders.CUDARowsFusedF16Kernels) && n == shaders.CUDARowsFusedF16Kernels[k-firstHalfClass]
	})
}

// halfSlotsClass is the fused class that RMSGRAD_CUDA_HALF_SLOTS compiles
// with its rows in shared-memory slots: c9, half rows 4224-5120.
const halfSlotsClass = 9

// halfSlotsEnv reads RMSGRAD_CUDA_HALF_SLOTS, a benchmark variant of class
// c9 (half rows 4224-5120): "P" or "P,R" compiles it with x and dy in P
// shared-memory slots filled by asynchronous copies, R rows a barrier
// (default 1), P-R rows in flight (rows_slots in the .cu). Unset or "0":
// none (p = 0).
func halfSlotsEnv() (p, r int, err error) {
	v := os.Getenv("RMSGRAD_CUDA_HALF_SLOTS")
	if v == "" || v == "0" {
		return 0, 0, nil
	}
	ps, rs, hasR := strings.Cut(v, ",")
	p, err1 := strconv.Atoi(ps)
	r, err2 := 1, error(nil)
	if hasR {
		r, err2 = strconv.Atoi(rs)
	}
	if err1 != nil || err2 != nil || r < 1 || r >= p || p > 4 {
		return 0, 0, fmt.Errorf("cuda: RMSGRAD_CUDA_HALF_SLOTS=%q: want P or P,R with 1 <= R < P <= 4 (slots, rows a barrier): %w", v, compute.ErrUnsupported)
	}
	return p, r, nil
}

// classSmem is the dynamic shared memory a block of fused class c uses at
// dim: c9's row slots under RMSGRAD_CUDA_HALF_SLOTS (P slots of x and dy,
// 2 bytes an element), w and the dw sums for a ws class (8*dim), else 0.
func (b *Backend) classSmem(c, dim int) int {
	if c == halfSlotsClass && b.halfSlots > 0 {
		return 4 * b.halfSlots * dim
	}
	if b.classTable()[c].ws {
		return 8 * dim
	}
	return 0
}

// smemBytes is the dynamic shared memory an entry's blocks use: its fused
// class's (classSmem), or the general kernel's row slots.
func (b *Backend) smemBytes(e *entry) int {
	if c := kernelClass(e.kernel()); c >= 0 {
		return b.classSmem(c, e.dim)
	}
	return e.stages * 8 * e.dim
}

// compileKernels compiles part p of shaders.CUDASource (RMS_PART=p) for
// b.arch and returns its cubin.
func (b *Backend) compileKernels(p int) ([]byte, error) {
	return b.compileSource(shaders.CUDASource, shaders.CUDAFile, b.compileOpts(p))
}

// compileSource compiles CUDA source src (named name in NVRTC's messages)
// with NVRTC options opts and returns its cubin.
func (b *Backend) compileSource(src, name string, opts []string) ([]byte, error) {
	nv := b.nv
	nvErr := func(call string, r int32) error {
		return &DriverError{Call: call, Code: int(r), Name: nv.nvrtcGetErrorString(r), kind: compute.ErrDevice}
	}
	var prog uintptr
	if r := nv.nvrtcCreateProgram(&prog, src, name, 0, nil, nil); r != 0 {
		return nil, nvErr("nvrtcCreateProgram", r)
	}
	defer nv.nvrtcDestroyProgram(&prog)
	cstr := make([][]byte, len(opts))
	ptrs := make([]*byte, len(opts))
	for i, o := range opts {
		cstr[i] = append([]byte(o), 0)
		ptrs[i] = &cstr[i][0]
	}
	r := nv.nvrtcCompileProgram(prog, int32(len(ptrs)), unsafe.Pointer(&ptrs[0]))
	runtime.KeepAlive(cstr)
	if r != 0 {
		var n uintptr
		log := ""
		if nv.nvrtcGetProgramLogSz(prog, &n) == 0 && n > 1 {
			buf := make([]byte, n)
			if nv.nvrtcGetProgramLog(prog, &buf[0]) == 0 {
				log = strings.TrimRight(string(buf), "\x00")
			}
		}
		return nil, fmt.Errorf("cuda: compiling %s for %s: %w\n%s", name, b.arch, nvErr("nvrtcCompileProgram", r), log)
	}
	var n uintptr
	if r := nv.nvrtcGetCUBINSize(prog, &n); r != 0 {
		return nil, nvErr("nvrtcGetCUBINSize", r)
	}
	if n == 0 {
		return nil, fmt.Errorf("cuda: NVRTC produced no cubin of %s for %s: %w", name, b.arch, compute.ErrUnsupported)
	}
	cubin := make([]byte, n)
	if r := nv.nvrtcGetCUBIN(prog, &cubin[0]); r != 0 {
		return nil, nvErr("nvrtcGetCUBIN", r)
	}
	return cubin, nil
}

// Name returns "cuda".
func (b *Backend) Name() string { return "cuda" }

// DeviceName returns e.g. "NVIDIA H200 (sm_90)".
func (b *Backend) DeviceName() string { return b.device }

// CompileTime is how long Open took to get the kernels: NVRTC's compile, or
// reading them from the cache (cubinCacheDir) or this process's first Open.
func (b *Backend) CompileTime() time.Duration { return b.compile }

// SelfCheckTime is how long Open's self-check took (0 when
// RMSGRAD_CUDA_SELFCHECK=0 skipped it).
func (b *Backend) SelfCheckTime() time.Duration { return b.selfCheckTime }

// bind makes the backend's context current on this goroutine's OS thread;
// call the returned func to unlock the thread.
func (b *Backend) bindCtx() (func(), error) {
	runtime.LockOSThread()
	if err := b.d.check("cuCtxSetCurrent", b.d.cuCtxSetCurrent(b.ctx)); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	return runtime.UnlockOSThread, nil
}

// sizeClass rounds n up to one of 4 steps per power of two (so a pooled
// allocation wastes at most 25%), at least 256 bytes.
func sizeClass(n int) int {
	if n <= 256 {
		return 256
	}
	p := 1
	for p*2 < n {
		p *= 2
	}
	step := p / 4
	return (n + step - 1) / step * step
}

// getMem returns a pooled or new allocation of at least n bytes. withHost
// asks for pinned host memory too. The context must be bound (bindCtx).
func (b *Backend) getMem(n int, withHost bool) (*mem, error) {
	c := sizeClass(n)
	b.poolMu.Lock()
	defer b.poolMu.Unlock()
	if withHost {
		if m := b.pooled(c); m != nil {
			return m, nil
		}
	}
	return b.newMem(c, withHost, true)
}

// devMem gives m its device memory if it has none yet (a buffer allocated
// at most mapMax bytes, now copied). The context must be bound.
func (b *Backend) devMem(m *mem) error {
	if m.dptr != 0 {
		return nil
	}
	b.allocs.Add(1)
	if err := b.d.check("cuMemAlloc", b.d.cuMemAlloc(&m.dptr, uintptr(m.size))); err != nil {
		m.dptr = 0
		return fmt.Errorf("cuda: allocating %d device bytes: %w", m.size, err)
	}
	return nil
}

// pooled takes an allocation of size class c from the pool, or returns
// nil. b.poolMu must be held.
func (b *Backend) pooled(c int) *mem {
	l := b.pool[c]
	if len(l) == 0 {
		return nil
	}
	m := l[len(l)-1]
	l[len(l)-1] = nil
	b.pool[c] = l[:len(l)-1]
	if m.arena {
		b.arenaPooled -= int64(m.size)
	} else {
		b.pooledBytes -= int64(m.size)
	}
	return m
}

// take accounts for m, taken from the pool or new, as handed out.
// b.poolMu must be held.
func (b *Backend) take(m *mem) {
	if m.arena {
		b.arenaLive += int64(m.size)
	} else {
		b.live += int64(m.size)
	}
}

// evictLocked takes pooled allocations out of the pool, largest size
// classes first and arena pieces never, until c more bytes fit under the
// limit or nothing more can go; the caller frees them (freeOutside).
// b.poolMu must be held.
func (b *Backend) evictLocked(c int64) []*mem {
	if b.limit <= 0 || b.live+b.pooledBytes+c <= b.limit {
		return nil
	}
	classes := make([]int, 0, len(b.pool))
	for k, l := range b.pool {
		if len(l) > 0 {
			classes = append(classes, k)
		}
	}
	slices.Sort(classes)
	var out []*mem
	for i := len(classes) - 1; i >= 0 && b.live+b.pooledBytes+c > b.limit; i-- {
		k := classes[i]
		l, kept := b.pool[k], b.pool[k][:0]
		for _, m := range l {
			if !m.arena && b.live+b.pooledBytes+c > b.limit {
				out = append(out, m)
				b.pooledBytes -= int64(m.size)
				continue
			}
			kept = append(kept, m)
		}
		clear(l[len(kept):])
		b.pool[k] = kept
	}
	return out
}

// freeOutside frees ms with the context bound, outside poolMu, which must
// be held on entry and is held again on return; Close waits for it
// (growing).
func (b *Backend) freeOutside(ms []*mem) {
	if len(ms) == 0 {
		return
	}
	b.growing++
	b.poolMu.Unlock()
	if unlock, err := b.bindCtx(); err == nil {
		for _, m := range ms {
			b.freeMem(m)
		}
		unlock()
	}
	b.poolMu.Lock()
	if b.growing--; b.growing == 0 {
		b.grown.Broadcast()
	}
}

// PoolStats reports the buffer pool: bytes in buffers handed out and not
// released, bytes kept for reuse (arena pieces included in both), and the
// bound on them: the limit plus the arena (0: no limit).
func (b *Backend) PoolStats() (live, pooled, limit int64) {
	b.poolMu.Lock()
	defer b.poolMu.Unlock()
	if b.limit > 0 {
		b.arenaMu.Lock()
		limit = b.limit + int64(b.arenaSize)
		b.arenaMu.Unlock()
	}
	return b.live + b.arenaLive, b.pooledBytes + b.arenaPooled, limit
}

// arenaFree is how many bytes the arena has left.
func (b *Backend) arenaFree() int {
	b.arenaMu.Lock()
	defer b.arenaMu.Unlock()
	return b.arenaSize - b.arenaUsed
}

// newMem allocates c bytes of device memory when dev or !withHost, and of
// pinned host memory mapped into the device's address space when withHost.
// The context must be bound, and b.poolMu or b.growMu (for reading) held,
// so that Close waits.
func (b *Backend) newMem(c int, withHost, dev bool) (*mem, error) {
	b.allocs.Add(1)
	m := &mem{size: c}
	if dev || !withHost {
		if err := b.d.check("cuMemAlloc", b.d.cuMemAlloc(&m.dptr, uintptr(c))); err != nil {
			return nil, fmt.Errorf("cuda: allocating %d device bytes: %w", c, err)
		}
	}
	if withHost {
		if host, hdev, ok := b.arenaTake(c); ok {
			// Zeroed by Reserve, and never handed out before.
			m.host, m.hdev, m.arena = host, hdev, true
			return m, nil
		}
		if err := b.d.check("cuMemHostAlloc", b.d.cuMemHostAlloc(&m.host, uintptr(c), memHostAllocPortab|memHostAllocDevMap)); err != nil {
			if m.dptr != 0 {
				b.d.cuMemFree(m.dptr)
			}
			return nil, fmt.Errorf("cuda: allocating %d pinned host bytes: %w", c, err)
		}
		if err := b.d.check("cuMemHostGetDevicePointer", b.d.cuMemHostGetDevicePtr(&m.hdev, m.host, 0)); err != nil {
			b.d.cuMemFreeHost(m.host)
			if m.dptr != 0 {
				b.d.cuMemFree(m.dptr)
			}
			return nil, fmt.Errorf("cuda: mapping %d pinned host bytes: %w", c, err)
		}
		clear(unsafe.Slice((*byte)(m.host), c))
	}
	return m, nil
}

func (b *Backend) freeMem(m *mem) {
	if m == nil {
		return
	}
	if m.host != nil && !m.arena {
		b.d.cuMemFreeHost(m.host)
	}
	if m.dptr != 0 {
		b.d.cuMemFree(m.dptr)
	}
}

// Alloc returns a buffer from the pool: pinned host memory (Bytes, Float32s),
// mapped into the device's address space, and device memory of the same
// size. A pooled buffer costs no driver call; a new one is allocated
// outside poolMu, so that handlers warming the pool up pin their buffers
// side by side and a pooled buffer is never kept waiting behind them.
func (b *Backend) Alloc(dtype compute.DType, shape ...int) (compute.Buffer, error) {
	if dtype.Size() == 0 {
		return nil, fmt.Errorf("cuda: Alloc: dtype %q: %w", dtype, compute.ErrInvalidArgument)
	}
	n := compute.NumElements(shape)
	if n < 0 || n > compute.MaxElements {
		return nil, fmt.Errorf("cuda: Alloc: shape %v: want a non-negative element count <= %d: %w", shape, compute.MaxElements, compute.ErrInvalidArgument)
	}
	c := sizeClass(n * dtype.Size())
	buf := func(m *mem) compute.Buffer {
		return &buffer{b: b, m: m, dtype: dtype, shape: append([]int(nil), shape...), n: n}
	}
	b.poolMu.Lock()
	if b.closed {
		b.poolMu.Unlock()
		return nil, fmt.Errorf("cuda: Alloc after Close: %w", compute.ErrDevice)
	}
	if m := b.pooled(c); m != nil {
		b.take(m)
		b.poolMu.Unlock()
		return buf(m), nil
	}
	// A new allocation: unless the arena has room for it, first make room
	// under the limit by freeing pooled buffers of other size classes. The
	// new bytes count as live from here, so that Allocs side by side make
	// room for each other (moved to arenaLive if they come from the arena).
	var evict []*mem
	if b.arenaFree() < c {
		evict = b.evictLocked(int64(c))
	}
	b.live += int64(c)
	if b.allocLocked {
		defer b.poolMu.Unlock()
	} else {
		b.growing++
		b.poolMu.Unlock()
		defer func() {
			b.poolMu.Lock()
			if b.growing--; b.growing == 0 {
				b.grown.Broadcast()
			}
			b.poolMu.Unlock()
		}()
	}
	m, err := b.allocBound(c, evict)
	if err != nil || m.arena {
		if !b.allocLocked {
			b.poolMu.Lock()
			defer b.poolMu.Unlock()
		}
		b.live -= int64(c)
		if err != nil {
			return nil, err
		}
		b.take(m)
	}
	return buf(m), nil
}

// allocBound frees evict and allocates c bytes (newMem) with the context
// bound.
func (b *Backend) allocBound(c int, evict []*mem) (*mem, error) {
	unlock, err := b.bindCtx()
	if err != nil {
		return nil, err
	}
	defer unlock()
	for _, m := range evict {
		b.freeMem(m)
	}
	// A buffer the kernels reach through its mapping needs no device
	// memory (devMem adds it if one is ever copied).
	return b.newMem(c, true, c > b.mapMax)
}

// Close releases the device. Buffers must be released first; pooled memory
// is freed here.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.poolMu.Lock()
	defer b.poolMu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	// Alloc makes no new allocation once closed is set; wait for those
	// under way (the context must outlive them).
	for b.growing > 0 {
		b.grown.Wait()
	}
	unlock, err := b.bindCtx()
	if err != nil {
		return err
	}
	defer unlock()
	b.destroy()
	return nil
}

// destroy frees everything; the context must be current.
func (b *Backend) destroy() {
	d := b.d
	if b.stream != 0 {
		d.cuStreamSynchronize(b.stream)
	}
	for c, l := range b.pool {
		for _, m := range l {
			b.freeMem(m)
		}
		delete(b.pool, c)
	}
	b.freeMem(b.scratch)
	b.freeMem(b.table)
	b.scratch, b.table = nil, nil
	if b.arenaHost != nil {
		d.cuMemFreeHost(b.arenaHost)
		b.arenaHost, b.arenaSize, b.arenaUsed = nil, 0, 0
	}
	for _, e := range []uintptr{b.evStart, b.evEnd, b.evK0, b.evK1} {
		if e != 0 {
			d.cuEventDestroy(e)
		}
	}
	if b.stream != 0 {
		d.cuStreamDestroy(b.stream)
	}
	for _, m := range b.mods {
		d.cuModuleUnload(m)
	}
	b.mods = nil
	if b.ctx != 0 {
		d.cuDevicePrimaryCtxRel(b.dev)
	}
	b.stream, b.ctx, b.evStart, b.evEnd, b.evK0, b.evK1 = 0, 0, 0, 0, 0, 0
}

// buffer is a compute.Buffer: pinned host view plus device copy.
type buffer struct {
	b        *Backend
	m        *mem
	dtype    compute.DType
	shape    []int
	n        int
	released bool
}

func (x *buffer) DType() compute.DType { return x.dtype }
func (x *buffer) Shape() []int         { return x.shape }
func (x *buffer) Len() int             { return x.n }
func (x *buffer) nbytes() int          { return x.n * x.dtype.Size() }

func (x *buffer) Bytes() []byte {
	if x.released {
		return nil
	}
	return unsafe.Slice((*byte)(x.m.host), x.nbytes())
}

func (x *buffer) Float32s() []float32 {
	if x.released || x.dtype != compute.F32 {
		return nil
	}
	return unsafe.Slice((*float32)(x.m.host), x.n)
}

// Release returns the memory to the backend's pool (freed at Close), or
// frees it when keeping it would take the pool over its limit (PoolLimit).
func (x *buffer) Release() {
	b := x.b
	b.poolMu.Lock()
	defer b.poolMu.Unlock()
	if x.released {
		return
	}
	x.released = true
	if b.closed {
		return // Close freed the pool; memory out of it was lost with the context.
	}
	m := x.m
	c := int64(m.size)
	if m.arena {
		b.arenaLive -= c
		b.arenaPooled += c
	} else {
		b.live -= c
		if b.limit > 0 && b.live+b.pooledBytes+c > b.limit {
			b.freeOutside([]*mem{m})
			return
		}
		b.pooledBytes += c
	}
	b.pool[m.size] = append(b.pool[m.size], m)
}
