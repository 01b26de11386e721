package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Options says what to check and for which platform.
type Options struct {
	// Dir is the directory go list runs in (the module); "" is the current one.
	Dir string
	// Patterns are go list package patterns, e.g. "./metal/...".
	Patterns []string
	// GOOS and GOARCH of the target; "" means darwin and arm64.
	GOOS, GOARCH string
	// Tests includes the named packages' _test.go files.
	Tests bool
	// Overlay is a go build -overlay JSON file (tests plant errors with it).
	Overlay string
}

// TypeError is one error in one package.
type TypeError struct {
	Package string
	Pos     string // file:line:col
	Msg     string
}

func (e TypeError) String() string { return e.Pos + ": " + e.Msg }

// Report is the result of a Check.
type Report struct {
	Checked []string    // import paths checked, dependencies first
	Targets []string    // the packages the patterns named
	Errors  []TypeError // every error, in package order
}

// listedPackage is the part of go list's JSON that Check uses.
type listedPackage struct {
	ImportPath string
	Dir        string
	Standard   bool
	DepOnly    bool
	ForTest    string
	GoFiles    []string
	CgoFiles   []string
	ImportMap  map[string]string
	Module     *struct{ GoVersion string }
	Error      *struct{ Pos, Err string }
}

// Check type-checks the packages opts.Patterns name, and all their
// dependencies, for the target platform.
func Check(ctx context.Context, opts Options) (Report, error) {
	goos, goarch := opts.GOOS, opts.GOARCH
	if goos == "" {
		goos = "darwin"
	}
	if goarch == "" {
		goarch = "arm64"
	}
	args := []string{"list", "-e", "-deps", "-json"}
	if opts.Tests {
		args = append(args, "-test")
	}
	overlay := map[string]string{}
	if opts.Overlay != "" {
		args = append(args, "-overlay", opts.Overlay)
		b, err := os.ReadFile(opts.Overlay)
		if err != nil {
			return Report{}, fmt.Errorf("darwincheck: overlay: %w", err)
		}
		var o struct{ Replace map[string]string }
		if err := json.Unmarshal(b, &o); err != nil {
			return Report{}, fmt.Errorf("darwincheck: overlay %s: %w", opts.Overlay, err)
		}
		for k, v := range o.Replace {
			overlay[filepath.Clean(k)] = v
		}
	}
	args = append(args, "--")
	args = append(args, opts.Patterns...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = opts.Dir
	// CGO_ENABLED=1 selects the cgo files; go list needs no C compiler for
	// that (only -compiled or -export would run cgo).
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Report{}, fmt.Errorf("darwincheck: go list: %w: %s", err, strings.TrimSpace(stderr.String()))
	}

	var rep Report
	fset := token.NewFileSet()
	checked := map[string]*types.Package{"unsafe": types.Unsafe}
	sizes := types.SizesFor("gc", goarch)
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return rep, fmt.Errorf("darwincheck: go list output: %w", err)
		}
		if p.ImportPath == "unsafe" {
			continue
		}
		// The generated test main lives in the build cache; nothing of ours.
		if strings.HasSuffix(p.ImportPath, ".test") {
			continue
		}
		target := !p.DepOnly && (p.ForTest == "" || !opts.Tests || strings.Contains(p.ImportPath, " ["))
		if target {
			rep.Targets = append(rep.Targets, p.ImportPath)
		}
		if p.Error != nil {
			rep.Errors = append(rep.Errors, TypeError{Package: p.ImportPath, Pos: p.Error.Pos, Msg: p.Error.Err})
			continue
		}
		var files []*ast.File
		var perr error
		for _, name := range append(append([]string{}, p.GoFiles...), p.CgoFiles...) {
			path := name
			if !filepath.IsAbs(path) {
				path = filepath.Join(p.Dir, name)
			}
			var src any
			if r, ok := overlay[filepath.Clean(path)]; ok {
				b, err := os.ReadFile(r)
				if err != nil {
					return rep, fmt.Errorf("darwincheck: overlay for %s: %w", path, err)
				}
				src = b
			}
			f, err := parser.ParseFile(fset, path, src, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				perr = err
				rep.Errors = append(rep.Errors, TypeError{Package: p.ImportPath, Pos: path, Msg: err.Error()})
				continue
			}
			files = append(files, f)
		}
		if perr != nil {
			continue
		}
		importMap := p.ImportMap
		conf := types.Config{
			FakeImportC: true,
			Sizes:       sizes,
			Importer: importerFunc(func(path string) (*types.Package, error) {
				if m, ok := importMap[path]; ok {
					path = m
				}
				if pkg, ok := checked[path]; ok {
					return pkg, nil
				}
				return nil, fmt.Errorf("package %s was not checked before its importer (or failed)", path)
			}),
			Error: func(err error) {
				te := TypeError{Package: p.ImportPath, Msg: err.Error()}
				var terr types.Error
				if errors.As(err, &terr) {
					te.Pos, te.Msg = terr.Fset.Position(terr.Pos).String(), terr.Msg
				}
				rep.Errors = append(rep.Errors, te)
			},
		}
		if p.Module != nil && p.Module.GoVersion != "" {
			conf.GoVersion = "go" + p.Module.GoVersion
		}
		// The package path without the " [x.test]" suffix of a test variant.
		path, _, _ := strings.Cut(p.ImportPath, " ")
		pkg, _ := conf.Check(path, fset, files, nil)
		if pkg != nil {
			checked[p.ImportPath] = pkg
		}
		rep.Checked = append(rep.Checked, p.ImportPath)
	}
	if len(rep.Targets) == 0 {
		return rep, fmt.Errorf("darwincheck: the patterns %v match no packages", opts.Patterns)
	}
	return rep, nil
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }
