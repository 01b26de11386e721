package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/rmsgrad/rmsgrad/compute"
)

// cuResult is a CUresult from the driver API.
type cuResult int32

// Device attributes (CUdevice_attribute) read at Open.
const (
	attrMultiprocessorCount = 16
	attrComputeCapMajor     = 75
	attrComputeCapMinor     = 76
	attrMaxSmemOptin        = 97 // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
	funcAttrMaxDynSmem      = 8  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	funcAttrLocalBytes      = 3  // CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES (spills, local arrays)
	funcAttrNumRegs         = 4  // CU_FUNC_ATTRIBUTE_NUM_REGS
)

// Context scheduling flags (CU_CTX_SCHED_*): how a synchronize waits.
const (
	ctxSchedAuto  = 0x0
	ctxSchedSpin  = 0x1
	ctxSchedYield = 0x2
	ctxSchedBlock = 0x4
)

const (
	streamNonBlocking  = 0x1 // CU_STREAM_NON_BLOCKING
	memHostAllocPortab = 0x1 // CU_MEMHOSTALLOC_PORTABLE
	memHostAllocDevMap = 0x2 // CU_MEMHOSTALLOC_DEVICEMAP
	eventDefault       = 0x0
	errNotInitialized  = 3   // CUDA_ERROR_NOT_INITIALIZED
	errNoDevice        = 100 // CUDA_ERROR_NO_DEVICE
)

// driverAPI holds the driver entry points. Device pointers (CUdeviceptr) are
// uint64; handles (CUcontext, CUstream, ...) are uintptr.
type driverAPI struct {
	cuInit                   func(flags uint32) cuResult
	cuDriverGetVersion       func(v *int32) cuResult
	cuDeviceGetCount         func(n *int32) cuResult
	cuDeviceGet              func(dev *int32, ordinal int32) cuResult
	cuDeviceGetName          func(name *byte, n int32, dev int32) cuResult
	cuDeviceGetAttribute     func(v *int32, attr int32, dev int32) cuResult
	cuDevicePrimaryCtxRetain func(ctx *uintptr, dev int32) cuResult
	cuDevicePrimaryCtxRel    func(dev int32) cuResult
	cuDevicePrimaryCtxFlags  func(dev int32, flags uint32) cuResult
	cuCtxSetCurrent          func(ctx uintptr) cuResult
	cuModuleLoadData         func(mod *uintptr, image unsafe.Pointer) cuResult
	cuModuleGetFunction      func(fn *uintptr, mod uintptr, name string) cuResult
	cuModuleUnload           func(mod uintptr) cuResult
	cuMemAlloc               func(p *uint64, size uintptr) cuResult
	cuMemFree                func(p uint64) cuResult
	cuMemHostAlloc           func(p *unsafe.Pointer, size uintptr, flags uint32) cuResult
	cuMemFreeHost            func(p unsafe.Pointer) cuResult
	cuMemHostGetDevicePtr    func(d *uint64, p unsafe.Pointer, flags uint32) cuResult
	cuMemcpyHtoDAsync        func(dst uint64, src unsafe.Pointer, n uintptr, s uintptr) cuResult
	cuMemcpyDtoHAsync        func(dst unsafe.Pointer, src uint64, n uintptr, s uintptr) cuResult
	cuMemcpyDtoDAsync        func(dst, src uint64, n uintptr, s uintptr) cuResult
	cuStreamCreate           func(s *uintptr, flags uint32) cuResult
	cuStreamSynchronize      func(s uintptr) cuResult
	cuStreamDestroy          func(s uintptr) cuResult
	cuEventCreate            func(e *uintptr, flags uint32) cuResult
	cuEventRecord            func(e uintptr, s uintptr) cuResult
	cuEventSynchronize       func(e uintptr) cuResult
	cuEventElapsedTime       func(ms *float32, start, end uintptr) cuResult
	cuEventDestroy           func(e uintptr) cuResult
	cuFuncSetAttribute       func(fn uintptr, attr int32, v int32) cuResult
	cuFuncGetAttribute       func(v *int32, attr int32, fn uintptr) cuResult
	cuOccupancyMaxBlocks     func(n *int32, fn uintptr, blockSize int32, smem uintptr) cuResult
	cuLaunchKernel           func(f uintptr, gx, gy, gz, bx, by, bz, shmem uint32, s uintptr, params unsafe.Pointer, extra unsafe.Pointer) cuResult
	// cuLaunchKernelEx (CUDA 11.8+; nil when the driver lacks it) takes
	// launch attributes: the dw reduction uses programmatic dependent launch.
	cuLaunchKernelEx func(cfg *launchConfig, f uintptr, params unsafe.Pointer, extra unsafe.Pointer) cuResult
	cuGetErrorName   func(r cuResult, s *unsafe.Pointer) cuResult
}

// bind resolves each symbol of fns in lib; a missing one is an error, never
// a panic (purego.RegisterLibFunc panics).
func bind(lib uintptr, libName string, fns map[string]any) error {
	for name, fptr := range fns {
		sym, err := purego.Dlsym(lib, name)
		if err != nil {
			return fmt.Errorf("%s: symbol %s: %v: %w", libName, name, err, compute.ErrUnsupported)
		}
		purego.RegisterFunc(fptr, sym)
	}
	return nil
}

// loadDriver opens libcuda.so.1 and binds the driver API.
func loadDriver() (*driverAPI, error) {
	lib, err := purego.Dlopen("libcuda.so.1", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("cuda: no NVIDIA driver (libcuda.so.1 not loadable: %v): %w", err, compute.ErrUnsupported)
	}
	d := &driverAPI{}
	// cuEventElapsedTime_v2 arrived in CUDA 12.8; older drivers have only
	// the plain name, with the same signature.
	elapsed := "cuEventElapsedTime_v2"
	if _, e := purego.Dlsym(lib, elapsed); e != nil {
		elapsed = "cuEventElapsedTime"
	}
	err = bind(lib, "libcuda.so.1", driverSymbols(d, elapsed))
	if err != nil {
		return nil, err
	}
	if sym, e := purego.Dlsym(lib, "cuLaunchKernelEx"); e == nil {
		purego.RegisterFunc(&d.cuLaunchKernelEx, sym)
	}
	return d, nil
}

// driverSymbols maps each driver symbol to the field of d it binds (every
// function field but cuLaunchKernelEx, which is optional); elapsed is the
// cuEventElapsedTime symbol the driver has (TestDriverSymbols checks that
// no field is left out).
func driverSymbols(d *driverAPI, elapsed string) map[string]any {
	return map[string]any{
		"cuInit":                        &d.cuInit,
		"cuDriverGetVersion":            &d.cuDriverGetVersion,
		"cuDeviceGetCount":              &d.cuDeviceGetCount,
		"cuDeviceGet":                   &d.cuDeviceGet,
		"cuDeviceGetName":               &d.cuDeviceGetName,
		"cuDeviceGetAttribute":          &d.cuDeviceGetAttribute,
		"cuDevicePrimaryCtxRetain":      &d.cuDevicePrimaryCtxRetain,
		"cuDevicePrimaryCtxRelease_v2":  &d.cuDevicePrimaryCtxRel,
		"cuDevicePrimaryCtxSetFlags_v2": &d.cuDevicePrimaryCtxFlags,
		"cuCtxSetCurrent":               &d.cuCtxSetCurrent,
		"cuModuleLoadData":              &d.cuModuleLoadData,
		"cuModuleGetFunction":           &d.cuModuleGetFunction,
		"cuModuleUnload":                &d.cuModuleUnload,
		"cuMemAlloc_v2":                 &d.cuMemAlloc,
		"cuMemFree_v2":                  &d.cuMemFree,
		"cuMemHostAlloc":                &d.cuMemHostAlloc,
		"cuMemFreeHost":                 &d.cuMemFreeHost,
		"cuMemHostGetDevicePointer_v2":  &d.cuMemHostGetDevicePtr,
		"cuMemcpyHtoDAsync_v2":          &d.cuMemcpyHtoDAsync,
		"cuMemcpyDtoHAsync_v2":          &d.cuMemcpyDtoHAsync,
		"cuMemcpyDtoDAsync_v2":          &d.cuMemcpyDtoDAsync,
		"cuStreamCreate":                &d.cuStreamCreate,
		"cuStreamSynchronize":           &d.cuStreamSynchronize,
		"cuStreamDestroy_v2":            &d.cuStreamDestroy,
		"cuEventCreate":                 &d.cuEventCreate,
		"cuEventRecord":                 &d.cuEventRecord,
		"cuEventSynchronize":            &d.cuEventSynchronize,
		elapsed:                         &d.cuEventElapsedTime,
		"cuEventDestroy_v2":             &d.cuEventDestroy,
		"cuLaunchKernel":                &d.cuLaunchKernel,
		"cuFuncSetAttribute":            &d.cuFuncSetAttribute,
		"cuFuncGetAttribute":            &d.cuFuncGetAttribute,
		"cuOccupancyMaxActiveBlocksPerMultiprocessor": &d.cuOccupancyMaxBlocks,
		"cuGetErrorName": &d.cuGetErrorName,
	}
}

// launchConfig is CUlaunchConfig and launchAttr CUlaunchAttribute (cuda.h):
// the id padded to 8 bytes, then a 64-byte value union.
type launchConfig struct {
	gridX, gridY, gridZ    uint32
	blockX, blockY, blockZ uint32
	sharedMem              uint32
	_                      uint32
	stream                 uintptr
	attrs                  *launchAttr
	numAttrs               uint32
	_                      uint32
}

type launchAttr struct {
	id    int32
	_     int32
	value [64]byte
}

// attrProgrammaticStreamSerialization is
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the kernel may
// start before the previous one in the stream has finished, and waits for
// it itself (griddepcontrol.wait).
const attrProgrammaticStreamSerialization = 6

// DriverError is a failed driver or NVRTC call. It wraps compute.ErrDevice
// (or compute.ErrUnsupported when no usable device exists).
type DriverError struct {
	Call string // the API function, e.g. "cuMemAlloc"
	Code int    // the CUresult / nvrtcResult
	Name string // the error's name, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	kind error
}

func (e *DriverError) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Call, e.Name, e.Code)
}

// Unwrap makes errors.Is(err, compute.ErrDevice) (or ErrUnsupported) true.
func (e *DriverError) Unwrap() error { return e.kind }

// check turns a CUresult into nil or a *DriverError wrapping ErrDevice.
func (d *driverAPI) check(call string, r cuResult) error {
	if r == 0 {
		return nil
	}
	return &DriverError{Call: call, Code: int(r), Name: d.errName(r), kind: compute.ErrDevice}
}

func (d *driverAPI) errName(r cuResult) string {
	var p unsafe.Pointer
	if d.cuGetErrorName == nil || d.cuGetErrorName(r, &p) != 0 || p == nil {
		return "CUDA_ERROR_UNKNOWN"
	}
	return cString(p)
}

// cString copies a NUL-terminated C string (at most 256 bytes: error names
// are short).
func cString(p unsafe.Pointer) string {
	b := unsafe.Slice((*byte)(p), 256)
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// nvrtcAPI holds the NVRTC entry points.
type nvrtcAPI struct {
	nvrtcVersion         func(major, minor *int32) int32
	nvrtcCreateProgram   func(p *uintptr, src, name string, nh int32, headers, names unsafe.Pointer) int32
	nvrtcCompileProgram  func(p uintptr, n int32, opts unsafe.Pointer) int32
	nvrtcGetProgramLogSz func(p uintptr, n *uintptr) int32
	nvrtcGetProgramLog   func(p uintptr, log *byte) int32
	nvrtcGetCUBINSize    func(p uintptr, n *uintptr) int32
	nvrtcGetCUBIN        func(p uintptr, out *byte) int32
	nvrtcDestroyProgram  func(p *uintptr) int32
	nvrtcGetErrorString  func(r int32) string
}

// nvrtcCandidates lists where libnvrtc may be: RMSGRAD_NVRTC first, then the
// loader's search path, then the usual toolkit and wheel locations (torch's
// nvidia-cuda-nvrtc wheel ships one).
func nvrtcCandidates() []string {
	var c []string
	if p := os.Getenv("RMSGRAD_NVRTC"); p != "" {
		c = append(c, p)
	}
	c = append(c, "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2")
	for _, pat := range []string{
		"/usr/local/cuda/lib64/libnvrtc.so*",
		"/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so*",
		"/usr/local/cuda-*/lib64/libnvrtc.so*",
		"/usr/lib/x86_64-linux-gnu/libnvrtc.so*",
		"/opt/*/.venv/lib/python3*/site-packages/nvidia/cu*/lib/libnvrtc.so*",
		"/opt/*/.venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so*",
		"/usr/local/lib/python3*/dist-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so*",
	} {
		m, _ := filepath.Glob(pat)
		c = append(c, m...)
	}
	return c
}

// preloadBuiltins loads the libnvrtc-builtins beside lib, when lib is a
// path: libnvrtc opens its builtins library by name at compile time, which
// the loader finds only on its search path, unless a library of that name
// is loaded already. A toolkit unpacked anywhere (Debian's libnvrtc11.2
// package extracted without installing it, as scripts/nvrtc.sh does) then
// works without LD_LIBRARY_PATH.
func preloadBuiltins(lib string) {
	if !strings.Contains(lib, "/") {
		return
	}
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(lib), "libnvrtc-builtins.so*"))
	for _, b := range m {
		if _, err := purego.Dlopen(b, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			return
		}
	}
}

// loadNVRTC opens the first loadable libnvrtc and binds it.
func loadNVRTC() (*nvrtcAPI, string, error) { return loadNVRTCFrom(nvrtcCandidates()) }

// loadNVRTCFrom opens the first loadable libnvrtc of cands and binds it.
func loadNVRTCFrom(cands []string) (*nvrtcAPI, string, error) {
	var lib uintptr
	var name string
	var errs []error
	for _, cand := range cands {
		preloadBuiltins(cand)
		l, err := purego.Dlopen(cand, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			lib, name = l, cand
			break
		}
		errs = append(errs, err)
	}
	if lib == 0 {
		return nil, "", fmt.Errorf("cuda: libnvrtc not found (set RMSGRAD_NVRTC to its path): %v: %w",
			errors.Join(errs...), compute.ErrUnsupported)
	}
	n := &nvrtcAPI{}
	if err := bind(lib, name, map[string]any{
		"nvrtcVersion":           &n.nvrtcVersion,
		"nvrtcCreateProgram":     &n.nvrtcCreateProgram,
		"nvrtcCompileProgram":    &n.nvrtcCompileProgram,
		"nvrtcGetProgramLogSize": &n.nvrtcGetProgramLogSz,
		"nvrtcGetProgramLog":     &n.nvrtcGetProgramLog,
		"nvrtcGetCUBINSize":      &n.nvrtcGetCUBINSize,
		"nvrtcGetCUBIN":          &n.nvrtcGetCUBIN,
		"nvrtcDestroyProgram":    &n.nvrtcDestroyProgram,
		"nvrtcGetErrorString":    &n.nvrtcGetErrorString,
	}); err != nil {
		return nil, "", err
	}
	return n, name, nil
}
