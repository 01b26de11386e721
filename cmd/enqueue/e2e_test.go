package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/rmsgrad/rmsgrad/compute/computetest"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// e2eShapes are the x shapes synth cycles through: several rows and dims,
// a single row, an odd dim, and leading dims ([batch, seq, D]).
const e2eShapes = "8x1024,64x512,1x257,2x3x64,32x768,2x32,5x4096,3x1x128,16x96"

// TestEndToEndS3 is the end-to-end test: a real redis-server, a real
// versitygw (S3), the built worker and the built enqueue binary. 500 jobs
// of mixed shapes go through `enqueue synth --wait`; all must complete, and
// every output, read back from S3 here, must equal the float64 oracle of the
// inputs read back from S3 and carry the result's sha256. Batches of more
// than one job must show in the results. Bad jobs enqueued among them must
// end archived at once with their message, and those that failed inside a
// command buffer (an output that overflows to Inf) must have batch-mates
// that completed.
func TestEndToEndS3(t *testing.T) {
	if testing.Short() {
		t.Skip("500 jobs through S3: skipped with -short")
	}
	e := newCLIEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const n = 500
	prefix := "s3://" + bucket + "/e2e"

	// The bad jobs' inputs, uploaded before the load starts.
	type badJob struct {
		j    jobs.Job
		want []string
		id   string
	}
	var bad []*badJob
	for i := 0; i < 12; i++ {
		// Finite inputs whose gradients overflow float32: dy near the
		// float32 maximum. The job reaches the batcher and fails after its
		// command buffer ran, so it had batch-mates.
		in := fmt.Sprintf("%s/bad/overflow%d.safetensors", prefix, i)
		huge := make([]float32, 4*64)
		for k := range huge {
			huge[k] = 3e38
		}
		e.put(in, safetensors.F32("x", []int{4, 64}, computetest.Uniform(uint64(900+i), 256, 1)),
			safetensors.F32("w", []int{64}, computetest.Uniform(uint64(950+i), 64, 1)),
			safetensors.F32("dy", []int{4, 64}, huge))
		bad = append(bad, &badJob{j: jobs.Job{X: in + "#x", W: in + "#w", DY: in + "#dy", Eps: 1e-6,
			Out: fmt.Sprintf("%s/bad/overflow%d.out.safetensors", prefix, i)}, want: []string{"non-finite values", "output (batch "}})
	}
	for i := 0; i < 4; i++ {
		in := fmt.Sprintf("%s/bad/shape%d.safetensors", prefix, i)
		e.put(in, safetensors.F32("x", []int{4, 64}, computetest.Uniform(uint64(800+i), 256, 1)),
			safetensors.F32("w", []int{64}, computetest.Uniform(uint64(850+i), 64, 1)),
			safetensors.F32("dy", []int{4, 63}, computetest.Uniform(uint64(870+i), 252, 1)))
		bad = append(bad,
			&badJob{j: jobs.Job{X: in + "#x", W: in + "#w", DY: in + "#dy", Eps: 1e-6, Out: in + ".out"},
				want: []string{"tensor dy", "shape [4 63]: want x's shape [4 64]"}},
			&badJob{j: jobs.Job{X: in + "#x", W: in + "#w", DY: in + "#x", Eps: 1e-6, Out: "s3://" + foreignBucket + "/out"},
				want: []string{"tensor out", "not allowed"}},
			&badJob{j: jobs.Job{X: in + "#missing", W: in + "#w", DY: in + "#x", Eps: 1e-6, Out: in + ".out2"},
				want: []string{"tensor x", "no such tensor in the object (it holds: x, w, dy)"}})
	}

	// synth uploads 500 jobs' inputs, enqueues them, waits, checks them
	// itself and prints a JSON report; the bad jobs go in while it enqueues.
	type synthRun struct {
		res cliResult
		rep synthReport
		err error
	}
	done := make(chan synthRun, 1)
	start := time.Now()
	go func() {
		r := e.run("synth", "--count", strconv.Itoa(n), "--shape", e2eShapes, "--prefix", prefix, "--run", "r1",
			"--seed", "7", "--wait", "--json")
		var rep synthReport
		err := json.Unmarshal([]byte(r.stdout), &rep)
		done <- synthRun{r, rep, err}
	}()
	// Spread the bad jobs over the enqueue phase so that they share
	// command buffers with good ones.
	waitQueued(ctx, t, e, 20)
	for i, b := range bad {
		id, err := e.client.Enqueue(ctx, b.j)
		if err != nil {
			t.Fatalf("bad job %d: %v", i, err)
		}
		b.id = id
		time.Sleep(30 * time.Millisecond)
	}
	sr := <-done
	elapsed := time.Since(start)
	if sr.err != nil || sr.res.code != 0 {
		t.Fatalf("synth: exit %d, %v\nstdout (tail): %s\nstderr: %s\nworker: %s", sr.res.code, sr.err,
			tail(sr.res.stdout, 2000), tail(sr.res.stderr, 2000), tail(e.logs.String(), 4000))
	}
	rep := sr.rep
	if rep.Jobs != n || rep.Completed != n || rep.Failed != 0 || rep.Wrong != 0 || len(rep.Outcomes) != n {
		t.Fatalf("synth report: %d jobs, %d completed, %d failed, %d wrong, %d outcomes", rep.Jobs, rep.Completed, rep.Failed, rep.Wrong, len(rep.Outcomes))
	}

	// Check every output here too, independently of synth: inputs and
	// outputs read back from S3, the oracle computed from those inputs.
	shapes, err := parseShapes(e2eShapes)
	if err != nil {
		t.Fatal(err)
	}
	batchOf := map[string]int{} // batch id -> completed good jobs in it
	sizes := map[int]int{}
	var mu sync.Mutex
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i, o := range rep.Outcomes {
		g.Go(func() error {
			want := fmt.Sprintf("synth-r1-%06d", i)
			if o.ID != want || o.State != "completed" || o.Result == nil {
				return fmt.Errorf("outcome %d: id %s state %s, want %s completed", i, o.ID, o.State, want)
			}
			in := fmt.Sprintf("%s/r1/%06d.in.safetensors", prefix, i)
			xShape, x, _ := e.read(in + "#x")
			_, w, _ := e.read(in + "#w")
			_, dy, _ := e.read(in + "#dy")
			if !equalInts(xShape, shapes[i%len(shapes)].dims) {
				return fmt.Errorf("job %d: x shape %v, want %v", i, xShape, shapes[i%len(shapes)].dims)
			}
			if err := e.checkOutputs(o.Result, x, w, dy, xShape, 1e-6, "dx", "dw"); err != nil {
				return fmt.Errorf("job %d (%v): %w", i, xShape, err)
			}
			mu.Lock()
			batchOf[o.Result.BatchID]++
			sizes[o.Result.BatchJobs]++
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	multi := 0
	for size, c := range sizes {
		if size > 1 {
			multi += c
		}
	}
	if multi == 0 {
		t.Fatalf("no batch of more than one job in %d results: %v", n, sizes)
	}

	// Bad jobs: archived at once (no retries) with their message; those
	// that failed in a command buffer had good batch-mates that completed.
	batchRE := regexp.MustCompile(`output \(batch ([0-9a-f]+-[0-9]+)`)
	withMates := 0
	for _, b := range bad {
		_, err := e.client.Wait(ctx, b.id)
		var fe *jobs.JobFailedError
		if !errors.As(err, &fe) {
			t.Fatalf("bad job %s: %v, want it failed", b.id, err)
		}
		if fe.Retried != 0 || !strings.Contains(fe.Msg, "job "+b.id) {
			t.Fatalf("bad job %s: retried %d, message %q: want no retries and a message naming the job", b.id, fe.Retried, fe.Msg)
		}
		for _, w := range b.want {
			if !strings.Contains(fe.Msg, w) {
				t.Fatalf("bad job %s: message %q lacks %q", b.id, fe.Msg, w)
			}
		}
		if m := batchRE.FindStringSubmatch(fe.Msg); m != nil && batchOf[m[1]] > 0 {
			withMates++
		}
	}
	if withMates == 0 {
		t.Fatalf("no overflowing job shared its command buffer with a good job that completed (jobs by batch size %v)", sizes)
	}
	t.Logf("%d good jobs completed and equal to the oracle, %d bad jobs archived (%d of them with completed batch-mates); jobs by batch size %v; %d batches; %.1f jobs/s over %.1fs",
		n, len(bad), withMates, sizes, len(batchOf), float64(n)/elapsed.Seconds(), elapsed.Seconds())
	e.stopWorker()
}

// waitQueued waits until synth's job k is in Redis (in any state), so that
// the bad jobs go in while synth's load flows.
func waitQueued(ctx context.Context, t *testing.T, e *cliEnv, k int) {
	t.Helper()
	id := fmt.Sprintf("synth-r1-%06d", k)
	for ctx.Err() == nil {
		if _, err := e.client.Status(ctx, id); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
