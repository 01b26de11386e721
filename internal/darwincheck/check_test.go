package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const root = "../.."

// The Metal backend and its tests type-check for darwin/arm64 with cgo,
// against darwinkit's darwin files (not the !darwin stub).
func TestMetalTypeChecks(t *testing.T) {
	rep, err := Check(context.Background(), Options{Dir: root, Patterns: []string{"./metal/..."}, Tests: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range rep.Errors {
		t.Errorf("%s", e)
	}
	for _, want := range []string{"github.com/rmsgrad/rmsgrad/metal", "github.com/progrium/darwinkit/macos/metal", "github.com/progrium/darwinkit/objc"} {
		if !slices.Contains(rep.Checked, want) {
			t.Errorf("%s was not checked (checked: %d packages)", want, len(rep.Checked))
		}
	}
	if !slices.Contains(rep.Targets, "github.com/rmsgrad/rmsgrad/metal") {
		t.Errorf("targets %v do not include the metal package", rep.Targets)
	}
}

// The programs that link the Metal backend type-check for darwin/arm64 with
// cgo, wiring included (cmd/worker's backend_metal.go, cmd/bench's
// openers), tests too.
func TestWorkerTypeChecks(t *testing.T) {
	rep, err := Check(context.Background(), Options{Dir: root, Patterns: []string{"./cmd/worker", "./cmd/bench"}, Tests: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range rep.Errors {
		t.Errorf("%s", e)
	}
	for _, want := range []string{"github.com/rmsgrad/rmsgrad/cmd/worker", "github.com/rmsgrad/rmsgrad/metal", "github.com/progrium/darwinkit/macos/metal"} {
		if !slices.Contains(rep.Checked, want) {
			t.Errorf("%s was not checked", want)
		}
	}
}

// deps lists the packages a pattern links for GOOS=darwin GOARCH=arm64 with
// cgo on or off, as the go command (not darwincheck) resolves them.
func deps(t *testing.T, pattern, cgo string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", pattern)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED="+cgo)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s (darwin/arm64, CGO_ENABLED=%s): %v", pattern, cgo, err)
	}
	return strings.Fields(string(out))
}

// The Mac worker and bench link the Metal backend: with cgo (what make
// build uses on a Mac) the build graph holds the metal package and
// darwinkit's Metal bindings; without cgo it holds the metal package's
// stub, which tells the user to rebuild with cgo, and no darwinkit.
func TestDarwinBuildGraphLinksMetal(t *testing.T) {
	for _, pat := range []string{"./cmd/worker", "./cmd/bench"} {
		with := deps(t, pat, "1")
		for _, want := range []string{"github.com/rmsgrad/rmsgrad/metal", "github.com/progrium/darwinkit/macos/metal"} {
			if !slices.Contains(with, want) {
				t.Errorf("%s for darwin/arm64 with cgo does not link %s", pat, want)
			}
		}
		without := deps(t, pat, "0")
		if !slices.Contains(without, "github.com/rmsgrad/rmsgrad/metal") || slices.Contains(without, "github.com/progrium/darwinkit/macos/metal") {
			t.Errorf("%s for darwin/arm64 without cgo: want the metal stub and no darwinkit", pat)
		}
	}
}

// make build compiles with cgo on for macOS and off elsewhere, and an
// explicit CGO_ENABLED wins.
func TestMakefileCgoPerOS(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	for _, c := range []struct{ env, want string }{
		{"GOOS=darwin", "1"}, {"GOOS=linux", "0"}, {"GOOS=darwin CGO_ENABLED=0", "0"},
	} {
		cmd := exec.Command("make", "-s", "cgo")
		cmd.Dir = root
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "CGO_ENABLED=") && !strings.HasPrefix(kv, "GOOS=") && !strings.HasPrefix(kv, "MAKE") {
				env = append(env, kv)
			}
		}
		cmd.Env = append(env, strings.Fields(c.env)...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("make cgo (%s): %v", c.env, err)
		}
		if got := strings.TrimSpace(string(out)); got != c.want {
			t.Errorf("make cgo with %s: CGO_ENABLED=%s, want %s", c.env, got, c.want)
		}
	}
}

// A planted error in a temp copy of a metal file (through a go build
// overlay) is reported at its position, in a plain Go file and in the cgo
// file alike.
func TestPlantedErrorIsCaught(t *testing.T) {
	cases := []struct{ file, old, new string }{
		{"execute_darwin.go", "cb.WaitUntilCompleted()", "cb.WaitUntilComplete()"},
		{"device_darwin.go", "objc.ObjectFrom(p)", "objc.ObjectFor(p)"},
		{"backend_darwin.go", "opts.SetFastMathEnabled(false)", "opts.SetFastMathEnabled(0)"},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			path, err := filepath.Abs(filepath.Join(root, "metal", c.file))
			if err != nil {
				t.Fatal(err)
			}
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(src), c.old); n != 1 {
				t.Fatalf("%s: %q occurs %d times, want 1 (update this test with the file)", c.file, c.old, n)
			}
			dir := t.TempDir()
			planted := filepath.Join(dir, c.file)
			if err := os.WriteFile(planted, []byte(strings.Replace(string(src), c.old, c.new, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			ov, _ := json.Marshal(map[string]map[string]string{"Replace": {path: planted}})
			overlay := filepath.Join(dir, "overlay.json")
			if err := os.WriteFile(overlay, ov, 0o644); err != nil {
				t.Fatal(err)
			}
			rep, err := Check(context.Background(), Options{Dir: root, Patterns: []string{"./metal"}, Overlay: overlay})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0].Pos, c.file) {
				t.Fatalf("errors %v, want exactly one in %s", rep.Errors, c.file)
			}
			t.Logf("caught: %s", rep.Errors[0])
		})
	}
}

// A pattern that matches nothing is an error, not a silent pass.
func TestNoPatternMatch(t *testing.T) {
	for _, pat := range []string{"./no/such/dir/...", "./shaders/mslcpu/cxx/..."} {
		rep, err := Check(context.Background(), Options{Dir: root, Patterns: []string{pat}})
		if err == nil && len(rep.Errors) == 0 {
			t.Errorf("%s: no error for a pattern matching no package", pat)
		}
	}
}
