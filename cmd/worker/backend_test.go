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
