package jobs

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/internal/syncbuf"
)

// newWork allocates a job's buffers on be and fills x, w, dy with seeded
// random values.
func newWork(t testing.TB, be compute.Backend, seed uint64, rows, dim int) *Work {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	mk := func(shape ...int) compute.Buffer {
		b, err := be.Alloc(compute.F32, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	w := &Work{X: mk(rows, dim), W: mk(dim), DY: mk(rows, dim), R: mk(rows), DX: mk(rows, dim), DW: mk(dim), Rows: rows, Dim: dim, Eps: 1e-6}
	for _, b := range []compute.Buffer{w.X, w.W, w.DY} {
		for i := range b.Float32s() {
			b.Float32s()[i] = float32(rng.NormFloat64())
		}
	}
	return w
}

func submitAll(t *testing.T, b *Batcher, ws []*Work) ([]BatchInfo, []error) {
	t.Helper()
	infos, errs := make([]BatchInfo, len(ws)), make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { infos[i], errs[i] = b.Submit(context.Background(), w) })
	}
	wg.Wait()
	return infos, errs
}

func TestBatcherFlushOnMaxJobs(t *testing.T) {
	be := &refBackend{}
	b := NewBatcher(be, BatchConfig{MaxJobs: 4, MaxWait: time.Hour}, nil, nil)
	defer b.Close(context.Background())
	ws := make([]*Work, 8)
	for i := range ws {
		ws[i] = newWork(t, be, uint64(i), 3, 16)
	}
	infos, errs := submitAll(t, b, ws)
	ids := map[string]int{}
	for i := range ws {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if infos[i].Jobs != 4 {
			t.Fatalf("job %d: batch of %d, want 4 (max_jobs)", i, infos[i].Jobs)
		}
		ids[infos[i].ID]++
	}
	if len(ids) != 2 {
		t.Fatalf("batch ids %v, want 2 batches of 4", ids)
	}
	if got := be.batchSizes(); !slices.Equal(got, []int{4, 4}) {
		t.Fatalf("command buffers had %v jobs, want [4 4]: one Execute per batch", got)
	}
}

func TestBatcherFlushOnMaxWait(t *testing.T) {
	be := &refBackend{}
	b := NewBatcher(be, BatchConfig{MaxJobs: 100, MaxWait: 30 * time.Millisecond}, nil, nil)
	defer b.Close(context.Background())
	ws := []*Work{newWork(t, be, 1, 2, 8), newWork(t, be, 2, 2, 8), newWork(t, be, 3, 2, 8)}
	start := time.Now()
	infos, errs := submitAll(t, b, ws)
	if el := time.Since(start); el < 30*time.Millisecond {
		t.Fatalf("flushed after %v, before max_wait", el)
	}
	for i := range ws {
		if errs[i] != nil || infos[i].Jobs != 3 {
			t.Fatalf("job %d: %+v %v, want one batch of 3", i, infos[i], errs[i])
		}
	}
}

func TestBatcherFlushOnMaxBytes(t *testing.T) {
	be := &refBackend{}
	w0 := newWork(t, be, 1, 4, 32)
	b := NewBatcher(be, BatchConfig{MaxJobs: 100, MaxBytes: 2 * w0.Bytes(), MaxWait: time.Hour}, nil, nil)
	defer b.Close(context.Background())
	ws := []*Work{w0, newWork(t, be, 2, 4, 32), newWork(t, be, 3, 4, 32), newWork(t, be, 4, 4, 32)}
	infos, errs := submitAll(t, b, ws)
	for i := range ws {
		if errs[i] != nil || infos[i].Jobs != 2 {
			t.Fatalf("job %d: %+v %v, want batches of 2 (max_bytes)", i, infos[i], errs[i])
		}
	}
}

func TestBatcherDropsCanceledJobs(t *testing.T) {
	be := &refBackend{}
	b := NewBatcher(be, BatchConfig{MaxJobs: 100, MaxWait: 80 * time.Millisecond}, nil, nil)
	defer b.Close(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	wa, wb := newWork(t, be, 1, 2, 8), newWork(t, be, 2, 2, 8)
	var errA, errB error
	var infoB BatchInfo
	var wg sync.WaitGroup
	wg.Go(func() { _, errA = b.Submit(ctx, wa) })
	wg.Go(func() { infoB, errB = b.Submit(context.Background(), wb) })
	wg.Wait()
	if !errors.Is(errA, ErrDropped) || !errors.Is(errA, context.Canceled) {
		t.Fatalf("canceled job: %v, want ErrDropped wrapping context.Canceled", errA)
	}
	if errB != nil || infoB.Jobs != 1 {
		t.Fatalf("live job: %+v %v, want a batch of 1", infoB, errB)
	}
	if got := be.batchSizes(); !slices.Equal(got, []int{1}) {
		t.Fatalf("encoded %v jobs, want [1]: the canceled job must not be encoded", got)
	}
	for _, v := range wa.R.Float32s() {
		if v != 0 {
			t.Fatal("the dropped job's r was computed")
		}
	}
}

func TestBatcherBitwiseEqualToSingleJob(t *testing.T) {
	be := &refBackend{}
	shapes := [][2]int{{1, 7}, {5, 64}, {3, 130}, {17, 33}, {2, 1}, {8, 256}}
	batched := make([]*Work, len(shapes))
	alone := make([]*Work, len(shapes))
	for i, s := range shapes {
		batched[i] = newWork(t, be, uint64(i), s[0], s[1])
		alone[i] = newWork(t, be, uint64(i), s[0], s[1])
	}
	b := NewBatcher(be, BatchConfig{MaxJobs: len(shapes), MaxWait: time.Hour}, nil, nil)
	infos, errs := submitAll(t, b, batched)
	b.Close(context.Background())
	one := NewBatcher(be, BatchConfig{MaxJobs: 1}, nil, nil)
	defer one.Close(context.Background())
	for i := range shapes {
		if errs[i] != nil || infos[i].Jobs != len(shapes) {
			t.Fatalf("job %d: %+v %v", i, infos[i], errs[i])
		}
		if info, err := one.Submit(context.Background(), alone[i]); err != nil || info.Jobs != 1 {
			t.Fatalf("single job %d: %+v %v", i, info, err)
		}
		for _, p := range [][2]compute.Buffer{{batched[i].DX, alone[i].DX}, {batched[i].DW, alone[i].DW}, {batched[i].R, alone[i].R}} {
			if !slices.Equal(p[0].Bytes(), p[1].Bytes()) {
				t.Fatalf("job %d %v: batched output differs bitwise from the single-job run", i, shapes[i])
			}
		}
		checkOracle(t, batched[i])
	}
}

// checkOracle compares w's outputs with a float64 evaluation of the seed's
// formulas.
func checkOracle(t *testing.T, w *Work) {
	t.Helper()
	x, wt, dy := w.X.Float32s(), w.W.Float32s(), w.DY.Float32s()
	d := w.Dim
	r := make([]float64, w.Rows)
	for b := range r {
		var s float64
		for i := 0; i < d; i++ {
			s += float64(x[b*d+i]) * float64(x[b*d+i])
		}
		r[b] = 1 / math.Sqrt(s/float64(d)+float64(w.Eps))
	}
	near := func(name string, i int, got float32, want float64) {
		if math.Abs(float64(got)-want) > 1e-4+1e-4*math.Abs(want) {
			t.Fatalf("%s[%d] = %v, oracle %v", name, i, got, want)
		}
	}
	for b := range r {
		near("r", b, w.R.Float32s()[b], r[b])
		var s float64
		for i := 0; i < d; i++ {
			s += float64(dy[b*d+i]) * float64(x[b*d+i]) * float64(wt[i])
		}
		if w.DX != nil {
			for k := 0; k < d; k++ {
				near("dx", b*d+k, w.DX.Float32s()[b*d+k], r[b]*(float64(dy[b*d+k])*float64(wt[k])-float64(x[b*d+k])*s*r[b]*r[b]/float64(d)))
			}
		}
	}
	if w.DW != nil {
		for i := 0; i < d; i++ {
			var s float64
			for b := range r {
				s += float64(dy[b*d+i]) * float64(x[b*d+i]) * r[b]
			}
			near("dw", i, w.DW.Float32s()[i], s)
		}
	}
}

var errBadJob = errors.New("injected device failure")

func TestBatcherFallsBackToOneJobPerCommandBuffer(t *testing.T) {
	be := &refBackend{}
	bad := newWork(t, be, 99, 4, 16)
	// The device fails any command buffer that holds the bad job.
	be.fail = func(ops []compute.Op) error {
		for _, op := range ops {
			if op.X == bad.X {
				return errBadJob
			}
		}
		return nil
	}
	ws := []*Work{newWork(t, be, 1, 4, 16), bad, newWork(t, be, 2, 3, 40)}
	m := NewMetrics(nil)
	b := NewBatcher(be, BatchConfig{MaxJobs: 3, MaxWait: time.Hour}, m, nil)
	defer b.Close(context.Background())
	infos, errs := submitAll(t, b, ws)
	if !errors.Is(errs[1], errBadJob) {
		t.Fatalf("bad job: %v, want the device error", errs[1])
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil {
			t.Fatalf("batch-mate %d failed with the bad job: %v", i, errs[i])
		}
		if !infos[i].Fallback || infos[i].Jobs != 1 {
			t.Fatalf("batch-mate %d: %+v, want a fallback run alone", i, infos[i])
		}
		checkOracle(t, ws[i])
	}
	if got := be.batchSizes(); !slices.Equal(got, []int{3, 1, 1, 1}) {
		t.Fatalf("command buffers %v, want the batch of 3 then each job alone", got)
	}
}

// TestBatcherRecoversBackendPanic: a backend that panics on one job's
// command buffer fails that job alone with a *BackendPanic; its
// batch-mates complete, re-run one by one, with the oracle's values; the
// batcher (and the process) goes on serving, and the panic is logged once
// per command buffer with its stack.
func TestBatcherRecoversBackendPanic(t *testing.T) {
	be := &refBackend{}
	bad := newWork(t, be, 99, 4, 16)
	be.fail = func(ops []compute.Op) error {
		for _, op := range ops {
			if op.X == bad.X {
				panic("planted backend bug")
			}
		}
		return nil
	}
	logs := &syncbuf.Buffer{}
	b := NewBatcher(be, BatchConfig{MaxJobs: 3, MaxWait: time.Hour}, nil, slog.New(slog.NewJSONHandler(logs, nil)))
	defer b.Close(context.Background())
	ws := []*Work{newWork(t, be, 1, 4, 16), bad, newWork(t, be, 2, 3, 40)}
	infos, errs := submitAll(t, b, ws)
	var p *BackendPanic
	if !errors.As(errs[1], &p) || p.Value != "planted backend bug" || !strings.Contains(errs[1].Error(), "panic in the compute backend: planted backend bug") {
		t.Fatalf("bad job: %v, want a *BackendPanic naming the panic", errs[1])
	}
	if !strings.Contains(string(p.Stack), "refBackend") {
		t.Fatalf("the panic's stack is not where it was raised:\n%s", p.Stack)
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil {
			t.Fatalf("batch-mate %d failed with the panicking job: %v", i, errs[i])
		}
		if !infos[i].Fallback || infos[i].Jobs != 1 {
			t.Fatalf("batch-mate %d: %+v, want a fallback run alone", i, infos[i])
		}
		checkOracle(t, ws[i])
	}
	if n := strings.Count(logs.String(), "compute backend panicked"); n != 2 {
		t.Fatalf("%d panic log lines, want 2 (the batch, then the job alone):\n%s", n, logs.String())
	}
	// The device loop lives on.
	after := []*Work{newWork(t, be, 3, 2, 8), newWork(t, be, 4, 2, 8), newWork(t, be, 5, 2, 8)}
	if _, errs := submitAll(t, b, after); errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("jobs after the panic: %v", errs)
	}
	for _, w := range after {
		checkOracle(t, w)
	}
}

func TestBatcherCloseDrains(t *testing.T) {
	be := &refBackend{delay: 20 * time.Millisecond}
	b := NewBatcher(be, BatchConfig{MaxJobs: 2, MaxWait: time.Hour}, nil, nil)
	ws := make([]*Work, 5)
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i := range ws {
		ws[i] = newWork(t, be, uint64(i), 2, 8)
		wg.Go(func() { _, errs[i] = b.Submit(context.Background(), ws[i]) })
	}
	time.Sleep(10 * time.Millisecond) // let every Submit hand its job over
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && !errors.Is(err, ErrBatcherClosed) {
			t.Fatalf("job %d: %v", i, err)
		}
		if err == nil {
			checkOracle(t, ws[i])
		}
	}
	n := 0
	for _, s := range be.batchSizes() {
		n += s
	}
	if n != len(ws) {
		t.Fatalf("%d of %d taken jobs computed before Close returned", n, len(ws))
	}
	if _, err := b.Submit(context.Background(), ws[0]); !errors.Is(err, ErrBatcherClosed) {
		t.Fatalf("Submit after Close = %v, want ErrBatcherClosed", err)
	}
}
