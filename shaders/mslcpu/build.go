package mslcpu

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/shaders"
)

//go:embed cxx/driver.cpp cxx/fiber_switch.h cxx/mslcpu_runtime.h cxx/metal_stdlib
var cxxFiles embed.FS

// ErrNoCompiler is returned by Build when the C++ compiler is not installed.
// It wraps compute.ErrUnsupported.
var ErrNoCompiler = fmt.Errorf("mslcpu: C++ compiler not found: %w", compute.ErrUnsupported)

// BuildOptions says what to compile and where.
type BuildOptions struct {
	// Dir is the directory the sources and the driver binary are written to.
	Dir string
	// Source is the MSL source; "" means shaders.MetalSource. Tests pass a
	// deliberately broken copy.
	Source string
	// CXX is the compiler; "" means $CXX, else g++.
	CXX string
	// Flags are extra compiler options (a test builds the driver with
	// -DFIBER_UCONTEXT, the fiber switch of hosts other than x86-64).
	Flags []string
}

// Build writes the shader (as shaders.MetalFile), the shim, the driver and
// the glue generated from the shader's kernel signatures into opts.Dir,
// compiles them, and returns the driver's path.
func Build(ctx context.Context, opts BuildOptions) (string, error) {
	src := opts.Source
	if src == "" {
		src = shaders.MetalSource
	}
	cxx := opts.CXX
	if cxx == "" {
		cxx = os.Getenv("CXX")
	}
	if cxx == "" {
		cxx = "g++"
	}
	cxxPath, err := exec.LookPath(cxx)
	if err != nil {
		return "", fmt.Errorf("%w (%s): %v", ErrNoCompiler, cxx, err)
	}
	decls, err := parseKernels(src)
	if err != nil {
		return "", err
	}
	glue, err := genGlue(decls, shaders.MetalFile)
	if err != nil {
		return "", err
	}
	inc := filepath.Join(opts.Dir, "include")
	if err := os.MkdirAll(inc, 0o755); err != nil {
		return "", fmt.Errorf("mslcpu: build: %w", err)
	}
	files := map[string][]byte{
		filepath.Join(opts.Dir, shaders.MetalFile): []byte(src),
		filepath.Join(opts.Dir, "glue.cpp"):        []byte(glue),
	}
	for _, name := range []string{"driver.cpp", "fiber_switch.h", "mslcpu_runtime.h", "metal_stdlib"} {
		b, err := cxxFiles.ReadFile("cxx/" + name)
		if err != nil {
			return "", fmt.Errorf("mslcpu: build: %w", err)
		}
		dst := filepath.Join(inc, name)
		if name == "driver.cpp" {
			dst = filepath.Join(opts.Dir, name)
		}
		files[dst] = b
	}
	for path, b := range files {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return "", fmt.Errorf("mslcpu: build: %w", err)
		}
	}
	out := filepath.Join(opts.Dir, "msl-cpu-driver")
	// -x c++ for the .metal file is implied by including it from glue.cpp.
	// -ffp-contract=off: the shader spells out every fma it wants, so the
	// compiler must not fuse anything else. -Wno-attributes: g++ ignores the
	// MSL [[buffer(n)]]-style attributes (the glue generator reads them).
	args := []string{"-std=c++17", "-O2", "-pthread", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror",
		"-Wno-attributes", "-Wno-unused-parameter", "-I", inc, "-I", opts.Dir,
		filepath.Join(opts.Dir, "driver.cpp"), filepath.Join(opts.Dir, "glue.cpp"), "-o", out}
	args = append(args, opts.Flags...)
	cmd := exec.CommandContext(ctx, cxxPath, args...)
	var msg bytes.Buffer
	cmd.Stdout, cmd.Stderr = &msg, &msg
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("mslcpu: compiling %s as C++ failed: %v\n%s", shaders.MetalFile, err, msg.String())
		}
		return "", fmt.Errorf("mslcpu: running %s: %w", cxxPath, err)
	}
	return out, nil
}
