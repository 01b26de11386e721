package cuda

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/shaders"
)

// fusedClass is one width class of the register path's fused kernels
// (RMS_FUSED_F32 and RMS_FUSED_HALF in shaders/rms_norm_backward.cu): rows
// in chunks of cw elements (4 for F32 x, 8 for BF16 and F16 x: rowsCW),
// dims of up to maxNch chunks, k chunks per thread, blocks of at most
// maxThreads (k*maxThreads >= maxNch: a block holds the class's widest
// row), and the launch bounds' fewest blocks per SM (which cap the
// registers); ws: w and the dw sums in shared memory (8*dim bytes a
// block).
type fusedClass struct {
	cw, k, maxNch, maxThreads, minBlocks int
	ws                                   bool
}

// fusedClasses are the .cu's classes c0..c12 (shaders.CUDARowsFusedKernels),
// in order of chunk width, then width, except c12 (half rows 1152-2048,
// between c7 and c8 in width), appended so that no class's number (its
// macros, its NVRTC part, its figures in docs/cuda.md) changed:
// classOrder is the order by width.
var fusedClasses = [...]fusedClass{
	{4, 2, 256, 128, 4, false},  // c0: F32 dims up to 1024
	{4, 2, 512, 256, 3, false},  // c1: up to 2048
	{4, 3, 768, 256, 2, false},  // c2: up to 3072
	{4, 4, 1024, 256, 2, false}, // c3: up to 4096
	{4, 4, 1088, 320, 2, true},  // c4: up to 4352, w and dw in shared memory
	{4, 4, 1536, 384, 1, false}, // c5: 4480 up to 6144
	{4, 4, 2048, 512, 1, false}, // c6: up to 8192
	{8, 2, 128, 128, 4, false},  // c7: BF16 and F16 dims up to 1024
	{8, 2, 512, 256, 3, true},   // c8: up to 4096, w and dw in shared memory
	{8, 4, 640, 256, 2, true},   // c9: up to 5120, w and dw in shared memory
	{8, 4, 768, 256, 3, true},   // c10: 5248 up to 6144 (blocks of 192, four a SM), one row a barrier
	{8, 4, 1024, 256, 2, true},  // c11: up to 8192, c9's kernel
	{8, 2, 256, 128, 6, true},   // c12: 1152 up to 2048, c7's kernel with w and dw in shared memory, six blocks a SM
}

// classOrder lists the classes by chunk width, then width: classOf takes
// the first in it that holds a row.
var classOrder = [...]int{0, 1, 2, 3, 4, 5, 6, 7, 12, 8, 9, 10, 11}

// firstHalfClass is the first class of chunks of 8 (BF16 and F16 rows):
// c7..c12 each have a BF16 and an F16 kernel.
const firstHalfClass = 7

func init() {
	if len(fusedClasses) != len(shaders.CUDARowsFusedKernels) || len(fusedClasses)-firstHalfClass != len(shaders.CUDARowsFusedF16Kernels) {
		panic("cuda: fusedClasses, shaders.CUDARowsFusedKernels and shaders.CUDARowsFusedF16Kernels disagree")
	}
	for c, fc := range fusedClasses {
		if (fc.cw == 8) != (c >= firstHalfClass) {
			panic("cuda: the half classes are not fusedClasses[firstHalfClass:]")
		}
	}
	seen := map[int]bool{}
	for i, c := range classOrder {
		if seen[c] || c < 0 || c >= len(fusedClasses) {
			panic("cuda: classOrder is not a permutation of the classes")
		}
		seen[c] = true
		if i > 0 {
			p, fc := fusedClasses[classOrder[i-1]], fusedClasses[c]
			if p.cw > fc.cw || (p.cw == fc.cw && p.maxNch >= fc.maxNch) {
				panic(fmt.Sprintf("cuda: classOrder puts class %d after a class as wide or wider", c))
			}
		}
	}
}

// classGeom is RMSGRAD_CUDA_CLASS_GEOM, read once (applyClassGeom): a
// benchmark variant of the fused classes' geometry, "c:KxTxM" items
// separated by commas (class c with K chunks per thread, blocks of up to T
// threads, launch bounds of at least M blocks per SM), K*T as the
// class's (K*T >= its widest row) so that the classes keep their dims;
// "c:KxTxM/N" also sets the class's widest row to N chunks (at most K*T),
// so that wider rows go to the next class of their chunk width (a
// benchmark of where a class should end); a final "s" keeps the class's w
// and dw sums in shared memory (piece-major, 8*dim bytes a block) and a
// final "r" in registers. It rewrites fusedClasses and gives each class's
// programs the matching -DRMS_Cc_K/_MAXT/_MINB (and _WS) options
// (compileOpts). The block size changes the order of the sums, so the bits
// of the dims of a changed class change with it (and stay the same from
// run to run and batch to batch).
var classGeom struct {
	once sync.Once
	opts map[int][]string
	err  error
}

// applyClassGeom applies RMSGRAD_CUDA_CLASS_GEOM (once a process).
func applyClassGeom() error {
	classGeom.once.Do(func() {
		classGeom.opts, classGeom.err = parseClassGeom(os.Getenv("RMSGRAD_CUDA_CLASS_GEOM"), fusedClasses[:])
	})
	return classGeom.err
}

// parseClassGeom applies v (RMSGRAD_CUDA_CLASS_GEOM's syntax) to classes
// and returns the compile options of each class it changed.
func parseClassGeom(v string, classes []fusedClass) (map[int][]string, error) {
	if v == "" {
		return nil, nil
	}
	bad := func(item, why string) error {
		return fmt.Errorf("cuda: RMSGRAD_CUDA_CLASS_GEOM item %q: %s: %w", item, why, compute.ErrUnsupported)
	}
	opts := map[int][]string{}
	for _, item := range strings.Split(v, ",") {
		var c, k, t, m, nch int
		spec, ws := item, ""
		if n := len(spec); n > 0 && (spec[n-1] == 's' || spec[n-1] == 'r') {
			spec, ws = spec[:n-1], spec[n-1:]
		}
		hasN := true
		if n, err := fmt.Sscanf(spec, "%d:%dx%dx%d/%d", &c, &k, &t, &m, &nch); n != 5 || err != nil || fmt.Sprintf("%d:%dx%dx%d/%d", c, k, t, m, nch) != spec {
			hasN = false
			if n, err := fmt.Sscanf(spec, "%d:%dx%dx%d", &c, &k, &t, &m); err != nil || n != 4 || fmt.Sprintf("%d:%dx%dx%d", c, k, t, m) != spec {
				return nil, bad(item, "want c:KxTxM or c:KxTxM/N, optionally ending in s or r (class, chunks per thread, threads, blocks per SM; widest row in chunks; w and the dw sums in shared memory or registers)")
			}
		}
		if c < 0 || c >= len(classes) {
			return nil, bad(item, fmt.Sprintf("no class %d (0..%d)", c, len(classes)-1))
		}
		fc := classes[c]
		switch {
		case k < 1 || k > 8:
			return nil, bad(item, "K must be 1..8 (RMS_KMAX)")
		case t < 32 || t > 1024 || t%32 != 0:
			return nil, bad(item, "T must be a multiple of 32 up to 1024")
		case k*t != fc.k*fc.maxThreads:
			return nil, bad(item, fmt.Sprintf("K*T must stay %d (class %d's widest row is %d chunks)", fc.k*fc.maxThreads, c, fc.maxNch))
		case m < 1 || m > 32:
			return nil, bad(item, "M must be 1..32")
		case hasN && (nch < 1 || nch > k*t):
			return nil, bad(item, fmt.Sprintf("N must be 1..%d (K*T)", k*t))
		}
		fc.k, fc.maxThreads, fc.minBlocks = k, t, m
		if hasN {
			fc.maxNch = nch
		}
		opts[c] = []string{fmt.Sprintf("-DRMS_C%d_K=%d", c, k), fmt.Sprintf("-DRMS_C%d_MAXT=%d", c, t), fmt.Sprintf("-DRMS_C%d_MINB=%d", c, m)}
		switch ws {
		case "s":
			fc.ws = true
			opts[c] = append(opts[c], fmt.Sprintf("-DRMS_C%d_WS=2", c))
		case "r":
			fc.ws = false
			opts[c] = append(opts[c], fmt.Sprintf("-DRMS_C%d_WS=0", c))
		}
		classes[c] = fc
	}
	return opts, nil
}

// rowsCW is the chunk width of rows whose x has dtype code tx: 8 elements
// for BF16 and F16 (16-byte loads), 4 for F32 (the .cu's rows_cw).
func rowsCW(tx int32) int {
	if tx == typeF32 {
		return 4
	}
	return 8
}

// classOf returns the fused class of a dim with chunks of cw elements and
// the block size of its rows (the fused kernel's and the general kernel's
// alike): for a multiple of cw up to 8192, the first class of that chunk
// width wide enough in classOrder, with 32*ceil(nch/k/32) threads (a block
// that fits the row: at most 31 threads without a chunk); else class -1
// and rowsThreads.
func classOf(dim, cw int) (class, threads int) { return classIn(fusedClasses[:], dim, cw) }

// classIn is classOf over table (fusedClasses or a variant of it: a
// class's widest row moved by RMSGRAD_CUDA_CLASS_GEOM's "/N" moves rows to
// or from the classes after it in classOrder).
func classIn(table []fusedClass, dim, cw int) (class, threads int) {
	if dim <= 0 || dim%cw != 0 {
		return -1, rowsThreads
	}
	nch := dim / cw
	for _, c := range classOrder {
		if fc := table[c]; fc.cw == cw && nch <= fc.maxNch {
			t := (nch + fc.k - 1) / fc.k
			return c, (t + 31) / 32 * 32
		}
	}
	return -1, rowsThreads
}

// estBlocksPerSM is how many blocks of a class's fused kernel fit on a
// multiprocessor at the register cap its launch bounds set (65536
// registers, 2048 threads, 32 blocks): a lower bound of the occupancy the
// driver reports, used where the backend has no device (tests).
func estBlocksPerSM(fc fusedClass, threads int) int {
	regs := 65536 / (fc.maxThreads * fc.minBlocks) / 8 * 8
	perWarp := (regs*32 + 255) / 256 * 256
	n := 65536 / (perWarp * (threads / 32))
	return max(1, min(n, 2048/threads, 32))
}

// maxDim is the widest dim a block of threads threads of the class holds.
func (fc fusedClass) maxDim(threads int) int { return fc.cw * fc.k * threads }

// maxBlocksPerSM caps the blocks per SM of a class: more, smaller groups
// only add dw partials.
const maxBlocksPerSM = 8

// blocksPerSM is how many blocks of threads threads of a fused class run on
// one multiprocessor at once: the driver's occupancy of the compiled
// kernels (measured at Open; a half class's fewer of its two), or the
// estimate without one.
func (b *Backend) blocksPerSM(class, threads int) int {
	n := 0
	if b.occ != nil {
		n = b.occ[class][threads/32-1]
	}
	if n <= 0 {
		n = estBlocksPerSM(b.classTable()[class], threads)
	}
	if b.maxPerSM > 0 {
		return min(n, b.maxPerSM)
	}
	return min(n, maxBlocksPerSM)
}

// smemReserve is shared memory per block left to the system and the
// kernel's static arrays.
const smemReserve = 1024

// geometry picks, for a job of rows x dim in chunks of cw elements
// (rowsCW), the block size, the fused class, the rows per group and the
// group count (persistent blocks: as many as fit on the device at once, at
// least minGroupElems elements each), and the shared-memory row slots of
// rows_smem (0 but when RMSGRAD_CUDA_STAGES asks for them). Dims that are a
// multiple of cw up to 8192 take the register path of their width class
// (classOf): each row and w in registers (or w in shared memory), S rows
// at once, as many blocks per SM as the kernel's occupancy allows; the
// others stream (256 threads, two blocks per SM). Measured on the H200:
// docs/cuda.md.
//
// The block size depends only on dim and cw and the groups only on rows,
// dim, cw and the device (its SM count and the compiled kernels'
// occupancy), so the sums do too. RMSGRAD_CUDA_STAGES=n (read at Open)
// takes the shared-memory path, 256 threads and two blocks per SM, for
// every F32 multiple of 4 up to 8192 with up to n slots; RMSGRAD_CUDA_BLOCKS_PER_SM forces the
// blocks per SM and RMSGRAD_CUDA_RG_ALIGN the groups' row alignment (0:
// none), for benchmark variants; RMSGRAD_CUDA_PDL=0 launches the dw
// reduction the ordinary way and RMSGRAD_CUDA_RED_CH=n in blocks of 32n
// threads, n 4-column chunks each (the same bits); RMSGRAD_CUDA_HALF_SLOTS compiles class c9
// with its rows in shared-memory slots (halfSlotsEnv; Backend.classSmem
// sizes them).
func (b *Backend) geometry(rows, dim, cw int) geom {
	sms := max(b.sms, 1)
	var gm geom
	gm.class, gm.threads = classIn(b.classTable(), dim, cw)
	perSM := 2
	smem := cw == 4 && b.maxStages > 0 && b.smemOptin > 0 && dim%4 == 0 && dim/4 <= rowsThreads*8
	switch {
	case smem:
		gm.class, gm.threads = -1, rowsThreads
	case gm.class >= 0:
		perSM = b.blocksPerSM(gm.class, gm.threads)
	}
	if b.perSM > 0 {
		perSM = b.perSM
	}
	gm.rg, gm.g = groups(rows, dim, perSM*sms, b.rgAlign)
	if smem {
		perBlock := (int(b.smemOptin)+smemReserve)/perSM - 2*smemReserve
		gm.stages = max(0, min(b.maxStages, perBlock/(8*dim), gm.rg))
	}
	return gm
}

// deviceProfile is a fused-class geometry measured on one GPU model and
// applied over the defaults (fusedClasses and the .cu's S and R macros,
// which were chosen on the H100) when the device's name holds match:
// geom in RMSGRAD_CUDA_CLASS_GEOM's syntax, opts the .cu macros of single
// classes (-DRMS_Cc_S, -DRMS_Cc_R). A class's block size, rows in
// registers and rows a barrier change where its rows are read and when its
// block sums, not the order of any sum, except that geom's K and T change
// the block size, and so the bits of the class's dims (as the device's SM
// count and occupancy already do through the groups: the bits depend on
// the job and the device).
type deviceProfile struct {
	name  string
	match string
	geom  string
	opts  []string
}

// deviceProfiles are the measured profiles (docs/cuda.md, "Geometry by
// device"); a device none matches runs the defaults.
var deviceProfiles = []deviceProfile{
	{name: "h200", match: "H200", geom: h200Geom, opts: h200Opts},
}

// profileFor returns the profile of a device named name, or nil for the
// defaults. RMSGRAD_CUDA_PROFILE (read by the caller) overrides it:
// "default" or a profile's name.
func profileFor(name, override string) (*deviceProfile, error) {
	switch override {
	case "":
	case "default":
		return nil, nil
	default:
		for i := range deviceProfiles {
			if deviceProfiles[i].name == override {
				return &deviceProfiles[i], nil
			}
		}
		names := []string{"default"}
		for _, p := range deviceProfiles {
			names = append(names, p.name)
		}
		return nil, fmt.Errorf("cuda: RMSGRAD_CUDA_PROFILE=%q: want one of %s: %w", override, strings.Join(names, ", "), compute.ErrUnsupported)
	}
	for i := range deviceProfiles {
		if strings.Contains(name, deviceProfiles[i].match) {
			return &deviceProfiles[i], nil
		}
	}
	return nil, nil
}

// applyProfile sets the backend's class table: fusedClasses (with
// RMSGRAD_CUDA_CLASS_GEOM's variant, when set) and over it p's geometry,
// except for the classes that variant names, which keep the variant's.
func (b *Backend) applyProfile(p *deviceProfile) error {
	b.classes = append([]fusedClass(nil), fusedClasses[:]...)
	b.profile, b.classOpts = nil, nil
	if p == nil {
		return nil
	}
	var items []string
	for _, it := range strings.Split(p.geom, ",") {
		var c int
		if _, err := fmt.Sscanf(it, "%d:", &c); err == nil {
			if _, variant := classGeom.opts[c]; variant {
				continue
			}
		}
		if it != "" {
			items = append(items, it)
		}
	}
	opts, err := parseClassGeom(strings.Join(items, ","), b.classes)
	if err != nil {
		return fmt.Errorf("cuda: geometry profile %s: %w", p.name, err)
	}
	b.profile, b.classOpts = p, opts
	return nil
}

// classTable is the backend's class table (fusedClasses for a backend without
// one: tests).
func (b *Backend) classTable() []fusedClass {
	if b.classes == nil {
		return fusedClasses[:]
	}
	return b.classes
}

// h200Geom and h200Opts are the H200's profile (docs/cuda.md, "Geometry by
// device"): c4 (w and the dw sums in shared memory, two blocks a SM) over
// f32 4224-5120, where c5 (one block a SM) ran 4608 at 83% of copy in the
// backend and c4's geometry 94.5% in the kernel-geometry harness (H200 run
// 58); c6 at two rows a barrier, 97.3-97.6% at 7168 in the harness against
// 92.6% at one row. On the H100 both lose (run 59), so it keeps the
// defaults.
const h200Geom = "4:4x320x2/1280s"

var h200Opts = []string{"-DRMS_C6_R=2"}
