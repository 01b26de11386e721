package cuda

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"strings"
)

// kernelRes is what a cubin records of one kernel: what the driver reports
// through cuFuncGetAttribute (NUM_REGS, LOCAL_SIZE_BYTES, SHARED_SIZE_BYTES,
// MAX_THREADS_PER_BLOCK), read without a GPU.
type kernelRes struct {
	Name       string
	Regs       int // registers per thread
	Local      int // bytes of local memory per thread (the stack frame: spills and local arrays)
	Shared     int // bytes of static shared memory per block, without the system's reserve
	MaxThreads int // __launch_bounds__'s first argument (0: none)
	MaxRegs    int // the register cap the launch bounds set (0: none)
}

// Attributes of a cubin's .nv.info sections (NVIDIA's EIATTR codes, as
// cuobjdump -elf names them) and their entry formats (EIFMT).
const (
	eiattrFrameSize  = 0x11 // EIATTR_FRAME_SIZE: symbol, bytes
	eiattrMaxThreads = 0x05 // EIATTR_MAX_THREADS: x, y, z
	eiattrMaxRegs    = 0x1b // EIATTR_MAXREG_COUNT
	eiattrRegCount   = 0x2f // EIATTR_REGCOUNT: symbol, registers

	eifmtNone  = 1
	eifmtByte  = 2
	eifmtHalf  = 3
	eifmtSized = 4
)

// cubinReserve is the shared memory per block that the CUDA system
// reserves on sm_80 and later, which the occupancy counts beside a block's
// own.
const cubinReserve = 1024

// parseCubin reads the kernels' resources from a cubin (an ELF file whose
// header carries NVIDIA's own ELF version, which debug/elf refuses, so a
// copy with the standard version is parsed).
// inSection is how much of each .nv.shared section is not the kernel's
// own static shared memory: NVRTC 11.8's sm_90 cubins count the system's
// reserve there (1 KiB more than the kernel declares), its sm_80 cubins do
// not; the driver's SHARED_SIZE_BYTES is the declared size either way.
func parseCubin(cubin []byte, inSection int) (map[string]*kernelRes, error) {
	if len(cubin) < 0x18 || !bytes.HasPrefix(cubin, []byte(elf.ELFMAG)) {
		return nil, fmt.Errorf("not an ELF file")
	}
	raw := bytes.Clone(cubin)
	raw[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.LittleEndian.PutUint32(raw[0x14:], uint32(elf.EV_CURRENT))
	f, err := elf.NewFile(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	syms, err := f.Symbols()
	if err != nil {
		return nil, err
	}
	symName := func(i uint32) string { // .nv.info's symbol indexes count the null symbol
		if i == 0 || int(i) > len(syms) {
			return ""
		}
		return syms[i-1].Name
	}
	out := map[string]*kernelRes{}
	get := func(name string) *kernelRes {
		if out[name] == nil {
			out[name] = &kernelRes{Name: name}
		}
		return out[name]
	}
	// Kernels are the functions with a .text.<name> section of their own.
	for _, s := range f.Sections {
		if name, ok := strings.CutPrefix(s.Name, ".text."); ok {
			get(name)
		}
	}
	for _, s := range f.Sections {
		switch {
		case strings.HasPrefix(s.Name, ".nv.shared."):
			if k := out[strings.TrimPrefix(s.Name, ".nv.shared.")]; k != nil {
				k.Shared = max(0, int(s.Size)-inSection)
			}
		case s.Name == ".nv.info" || strings.HasPrefix(s.Name, ".nv.info."):
			fn := strings.TrimPrefix(strings.TrimPrefix(s.Name, ".nv.info"), ".")
			b, err := s.Data()
			if err != nil {
				return nil, err
			}
			for len(b) >= 4 {
				format, attr := b[0], b[1]
				var val []byte
				switch format {
				case eifmtNone, eifmtByte, eifmtHalf:
					val, b = b[2:4], b[4:]
				case eifmtSized:
					n := int(binary.LittleEndian.Uint16(b[2:]))
					if 4+n > len(b) {
						return nil, fmt.Errorf("%s: attribute %#x of %d bytes overruns the section", s.Name, attr, n)
					}
					val, b = b[4:4+n], b[4+n:]
				default:
					return nil, fmt.Errorf("%s: unknown attribute format %d", s.Name, format)
				}
				u32 := func(i int) int { return int(binary.LittleEndian.Uint32(val[4*i:])) }
				switch {
				case fn == "" && (attr == eiattrRegCount || attr == eiattrFrameSize) && len(val) == 8:
					if k := out[symName(uint32(u32(0)))]; k != nil {
						if attr == eiattrRegCount {
							k.Regs = u32(1)
						} else {
							k.Local = u32(1)
						}
					}
				case fn != "" && attr == eiattrMaxThreads && len(val) == 12 && out[fn] != nil:
					out[fn].MaxThreads = u32(0) * u32(1) * u32(2)
				case fn != "" && attr == eiattrMaxRegs && format == eifmtHalf && out[fn] != nil:
					out[fn].MaxRegs = int(binary.LittleEndian.Uint16(val))
				}
			}
		}
	}
	return out, nil
}

// smLimits are one architecture's per-multiprocessor limits (the CUDA
// programming guide's table of compute capabilities).
// inSection: see parseCubin.
type smLimits struct {
	regs, threads, blocks, smem, smemOptin, inSection int
}

var archLimits = map[string]smLimits{
	"sm_80": {65536, 2048, 32, 167936, 166912, 0},    // A100: 164 KiB a SM, 163 KiB a block
	"sm_90": {65536, 2048, 32, 233472, 232448, 1024}, // H100, H200: 228 KiB, 227 KiB
}

// occupancy is how many blocks of threads threads using k's registers and
// static shared memory plus dyn bytes fit on one multiprocessor of l
// (registers allocated per warp in units of 256, and the reserve per block).
func (l smLimits) occupancy(k *kernelRes, threads, dyn int) int {
	warps := (threads + 31) / 32
	perWarp := (k.Regs*32 + 255) / 256 * 256
	n := min(l.threads/threads, l.blocks)
	if perWarp > 0 {
		n = min(n, l.regs/perWarp/warps)
	}
	return min(n, l.smem/(k.Shared+dyn+cubinReserve))
}
