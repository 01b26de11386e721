package main

import (
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		stack []string
		want  string
	}{
		{[]string{"runtime.memmove", "github.com/rmsgrad/rmsgrad/compute/cpu.(*task).do", "github.com/rmsgrad/rmsgrad/compute/cpu.(*plan).runTasks.func1"}, "compute"},
		{[]string{"crypto/sha256.Sum256", "github.com/rmsgrad/rmsgrad/compute.(*CommandBuffer).Commit", "github.com/rmsgrad/rmsgrad/jobs.(*Batcher).run"}, "compute"},
		{[]string{"internal/runtime/syscall/linux.Syscall6", "syscall.Syscall", "net.(*conn).Read", "github.com/rmsgrad/rmsgrad/storage/s3.(*Store).read"}, "network"},
		{[]string{"runtime.mallocgc", "github.com/minio/minio-go/v7/pkg/signer.signV4", "github.com/rmsgrad/rmsgrad/storage/s3.(*Store).Put"}, "network"},
		{[]string{"crypto/hmac.New", "github.com/rmsgrad/rmsgrad/storage/s3.(*fastGet).sign", "github.com/rmsgrad/rmsgrad/storage.(*Router).Head"}, "network"},
		{[]string{"runtime.memmove", "github.com/rmsgrad/rmsgrad/storage.(*Router).Fetch", "github.com/rmsgrad/rmsgrad/jobs.(*Handler).process"}, "rmsgrad"},
		{[]string{"github.com/redis/go-redis/v9.(*baseClient).process", "github.com/hibiken/asynq/internal/rdb.(*RDB).Done"}, "network"},
		{[]string{"runtime.mallocgc", "github.com/rmsgrad/rmsgrad/jobs.checkFinite", "github.com/hibiken/asynq.(*processor).exec"}, "rmsgrad"},
		{[]string{"google.golang.org/protobuf/proto.Marshal", "github.com/hibiken/asynq/internal/base.EncodeMessage"}, "asynq"},
		{[]string{"runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker"}, "runtime"},
		{[]string{"time.Now", "main.main"}, "other"},
		{nil, "other"},
	} {
		if got := classify(c.stack); got != c.want {
			t.Errorf("classify(%v) = %s, want %s", c.stack, got, c.want)
		}
	}
}

//go:noinline
func spinForProfile(until time.Duration) (n uint64) {
	start := cpuTime()
	for cpuTime()-start < until {
		for i := range 100000 {
			n += uint64(i) * 2654435761
		}
	}
	return n
}

// TestReadProfile decodes a real CPU profile with the bench's own protobuf
// reader: a function that burned at least 300 ms of CPU must show up with
// about that much time, and analyzeCPUProfile must count it as overhead
// (it is none of network or compute).
func TestReadProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	spinForProfile(300 * time.Millisecond)
	pprof.StopCPUProfile()
	f.Close()
	samples, err := readProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spin int64
	for _, s := range samples {
		for _, fn := range s.stack {
			if strings.HasSuffix(fn, ".spinForProfile") {
				spin += s.ns
				break
			}
		}
	}
	// The profiler samples at 100 Hz: 300 ms of CPU is about 30 samples;
	// allow for a loaded machine's jitter and the spin's own cpuTime calls.
	if spin < int64(150*time.Millisecond) || spin > int64(3*time.Second) {
		t.Fatalf("spinForProfile has %v of samples, want about 300ms (%d samples in the profile)", time.Duration(spin), len(samples))
	}
	p, err := analyzeCPUProfile(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	if p.Total < spin || p.OverheadPerJob() < float64(spin)/1e3/2/2 {
		t.Fatalf("split %+v: total %d ns and overhead %.0f us/job for %d ns of spinning", p, p.Total, p.OverheadPerJob(), spin)
	}
	if _, err := readProfile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("readProfile of a missing file succeeded")
	}
	bad := filepath.Join(t.TempDir(), "bad.prof")
	_ = os.WriteFile(bad, []byte("not a profile"), 0o644)
	if _, err := readProfile(bad); err == nil {
		t.Fatal("readProfile of garbage succeeded")
	}
}

func TestMedianOf(t *testing.T) {
	id := func(x float64) float64 { return x }
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}, {nil, 0}} {
		if got := medianOf(c.in, id); got != c.want {
			t.Errorf("medianOf(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestProcCPU(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	spinForProfile(200 * time.Millisecond)
	after, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := after - before; d < 150*time.Millisecond || d > 5*time.Second {
		t.Fatalf("/proc says %v of CPU for a 200ms spin", d)
	}
}
