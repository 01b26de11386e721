package main

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
)

// backend: metal where Metal cannot open fails at start with the reason;
// auto moves on past it.
func TestMetalBackendSelection(t *testing.T) {
	if runtime.GOOS == "darwin" {
		t.Skip("on a Mac, metal opens for real: go test ./metal/ checks it")
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	_, err := openBackend("metal", 0, log)
	if !errors.Is(err, compute.ErrUnsupported) || !strings.Contains(err.Error(), "needs macOS") {
		t.Fatalf("backend metal on %s: %v, want ErrUnsupported saying it needs macOS", runtime.GOOS, err)
	}
	be, err := openBackend("auto", 0, log)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if be.Name() == "metal" {
		t.Fatal("auto opened metal off a Mac")
	}
}

// The launchd job parses as a property list (Python's plistlib, as
// launchd's own parser would refuse a malformed one) and its
// ProgramArguments are flags this worker accepts, asking for the Metal
// backend, with the config file the plist's install steps put in place.
func TestLaunchdPlist(t *testing.T) {
	py := os.Getenv("RMSGRAD_PYTHON")
	if py == "" {
		py = "python3"
	}
	if _, err := exec.LookPath(py); err != nil {
		t.Skipf("%s not found: cannot parse the plist", py)
	}
	out, err := exec.Command(py, "-c", `import json, plistlib, sys
with open(sys.argv[1], "rb") as f:
    p = plistlib.load(f)
json.dump(p, sys.stdout)`, "../../configs/com.rmsgrad.worker.plist").Output()
	if err != nil {
		t.Fatalf("plistlib could not load the plist: %v", err)
	}
	var p struct {
		Label             string
		ProgramArguments  []string
		KeepAlive         map[string]bool
		ThrottleInterval  int
		ExitTimeOut       int
		StandardErrorPath string
	}
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	if p.Label != "com.rmsgrad.worker" || len(p.ProgramArguments) < 2 {
		t.Fatalf("plist %+v", p)
	}
	if p.ThrottleInterval < 10 {
		t.Errorf("ThrottleInterval %d: a worker that cannot start (a GPU the kernels refuse) would be restarted in a tight loop", p.ThrottleInterval)
	}
	args := append([]string(nil), p.ProgramArguments[1:]...)
	for i := range args {
		if args[i] == "--config" && i+1 < len(args) {
			args[i+1] = "../../configs/worker.yaml" // the file the install steps copy there
		}
	}
	cfg, _, err := loadConfig(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("the worker refuses the plist's arguments %q: %v", p.ProgramArguments[1:], err)
	}
	if cfg.Backend != "metal" {
		t.Errorf("the plist runs backend %q, want metal", cfg.Backend)
	}
	if d := time.Duration(p.ExitTimeOut) * time.Second; d <= cfg.Shutdown {
		t.Errorf("ExitTimeOut %v is not above shutdown_timeout %v: launchd would SIGKILL a draining worker", d, cfg.Shutdown)
	}
}
