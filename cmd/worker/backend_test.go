package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/internal/syncbuf"
)

// TestOpenBackendProgress: a backend that is slow to open (the cuda
// backend compiling its kernels) gets progress lines naming it while it
// opens, and none once it has opened; a quick one gets none.
func TestOpenBackendProgress(t *testing.T) {
	after, every := openProgressAfter, openProgressEvery
	openProgressAfter, openProgressEvery = 20*time.Millisecond, 20*time.Millisecond
	defer func() { openProgressAfter, openProgressEvery = after, every }()
	backends["slow-test"] = func(n int64) (compute.Backend, error) {
		time.Sleep(150 * time.Millisecond)
		return cpu.New(cpu.PoolLimit(n)), nil
	}
	defer delete(backends, "slow-test")

	var buf syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	be, err := openBackend("slow-test", 0, log)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	out := buf.String()
	if n := strings.Count(out, "still opening the compute backend"); n < 2 || !strings.Contains(out, "backend=slow-test") {
		t.Fatalf("slow open: %d progress lines naming the backend; want at least 2:\n%s", n, out)
	}
	time.Sleep(80 * time.Millisecond)
	if n2 := strings.Count(buf.String(), "still opening"); n2 != strings.Count(out, "still opening") {
		t.Fatalf("progress lines after the backend opened:\n%s", buf.String())
	}

	var quick syncbuf.Buffer
	be2, err := openBackend("cpu", 0, slog.New(slog.NewTextHandler(&quick, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer be2.Close()
	time.Sleep(60 * time.Millisecond)
	if strings.Contains(quick.String(), "still opening") {
		t.Fatalf("quick open logged progress:\n%s", quick.String())
	}
}

// fakeReserver is a backend with a Reserve method (as cuda has).
type fakeReserver struct {
	compute.Backend
	got int64
	err error
}

func (f *fakeReserver) Reserve(n int64) (time.Duration, error) {
	f.got = n
	return time.Millisecond, f.err
}

// TestReservePinned: pin_reserve_bytes reaches a backend that can reserve
// (-1 meaning budget_bytes, 0 none), a failed reserve is a warning and not
// fatal, and a backend without Reserve is left alone.
func TestReservePinned(t *testing.T) {
	cfg := defaultConfig()
	if got := cfg.pinReserve(); got != cfg.BudgetBytes {
		t.Fatalf("default pinReserve %d, want budget_bytes %d", got, cfg.BudgetBytes)
	}
	var buf syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	f := &fakeReserver{Backend: cpu.New()}
	reservePinned(f, cfg.pinReserve(), log)
	if f.got != 2<<30 || !strings.Contains(buf.String(), "pinned host memory reserved") {
		t.Fatalf("reserve got %d, log:\n%s", f.got, buf.String())
	}
	cfg.PinReserveBytes = 0
	f = &fakeReserver{Backend: cpu.New(), got: -7}
	reservePinned(f, cfg.pinReserve(), log)
	if f.got != -7 {
		t.Fatalf("pin_reserve_bytes 0 called Reserve(%d)", f.got)
	}
	f = &fakeReserver{Backend: cpu.New(), err: compute.ErrDevice}
	reservePinned(f, 64<<20, log)
	if !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "pinned as they are needed") {
		t.Fatalf("a failed reserve: log:\n%s", buf.String())
	}
	reservePinned(cpu.New(), 64<<20, log) // no Reserve: nothing to do, no panic
}

// TestWarnBudget: a budget below limits.max_job_bytes is named in a
// warning at start; the defaults (2 GiB against 1 GiB) give none.
func TestWarnBudget(t *testing.T) {
	var buf syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	cfg := defaultConfig()
	warnBudget(cfg, log)
	if buf.String() != "" {
		t.Fatalf("defaults warned:\n%s", buf.String())
	}
	cfg.BudgetBytes = 256 << 20
	warnBudget(cfg, log)
	if out := buf.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "budget_bytes=268435456") || !strings.Contains(out, "max_job_bytes=1073741824") {
		t.Fatalf("budget below max_job_bytes: log:\n%s", out)
	}
}
