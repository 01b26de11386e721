package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"golang.org/x/sync/errgroup"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/storage"
)

// shape is one job class: x and dy are [Rows, Dim] f32.
type shape struct {
	Name      string
	Rows, Dim int
	Jobs      int // how many jobs (or objects) to run for this class
	// Staged is how many jobs' inputs are staged (0: Jobs); job i reads
	// those of job i mod Staged.
	Staged int
	// DType is the dtype of every tensor the end-to-end runs stage and
	// the worker writes back ("" is F32).
	DType compute.DType
	// Warm asks bin/worker runs for a second pass: after the first Jobs
	// jobs (a fresh worker, timed as Cold), settle, then Jobs more jobs
	// timed in the same process, whose buffers are pooled already.
	Warm bool
	// Stream times bin/worker runs on a busy worker: streamPasses*Jobs
	// jobs are enqueued before it starts; its first Jobs completions,
	// timed from its start line, are the Cold pass; after a sync, the
	// result is the jobs completed over the next Jobs' worth, counted from
	// the count read as the clock starts to the count at the poll that
	// stops it.
	// A class whose run lasts a fraction of a second (small: 2000 jobs in
	// about 0.2 s on a 16-core host) otherwise times the worker's start
	// (dialling storage, filling its pools) and its drain as much as its
	// rate; a deployed worker serves a queue that does not empty.
	Stream bool
	// PinW sets every job's w_sha256 to w's digest (jobs.Job.WSHA256), so
	// that a worker serves w from its pin cache after the first job.
	PinW bool
}

// streamPasses is how many passes of a Stream shape's jobs a run posts:
// cold, timed, and two that the worker takes during the sync between them
// and after the window (a sync of the cold pass's writeback took 50-105
// ms on the H100 hosts, 500-900 small jobs there).
const streamPasses = 4

// window says which jobs a Stream class's rows time ("" otherwise).
func (s shape) window() string {
	if !s.Stream {
		return ""
	}
	return fmt.Sprintf("timed on a busy worker: %d jobs, once its first %d are done and their writes synced, of %d posted", s.Jobs, s.Jobs, streamPasses*s.Jobs)
}

// dtype is s.DType, F32 when unset.
func (s shape) dtype() compute.DType {
	if s.DType == "" {
		return compute.F32
	}
	return s.DType
}

// staged is how many jobs' inputs s stages.
func (s shape) staged() int {
	if s.Staged > 0 {
		return s.Staged
	}
	return s.Jobs
}

// XBytes is the size of x (and of dy and dx) in bytes.
func (s shape) XBytes() int { return s.Rows * s.Dim * s.dtype().Size() }

// TensorBytes is what one job moves: x, w, dy in and dx, dw out.
func (s shape) TensorBytes() int { return 3*s.XBytes() + 2*s.Dim*s.dtype().Size() }

// storageResult is the minio-go ceiling for one object size.
type storageResult struct {
	Shape       shape
	Objects     int
	Concurrency int
	PutPerS     float64
	GetPerS     float64
	PutGBs      float64
	GetGBs      float64
	// The servers' CPU and the machine's busy cores during the PUTs and
	// the GETs (OK false where /proc could not be read).
	PutCPU, GetCPU serverCPU
}

// GWPerJob is versitygw's CPU per job-equivalent (2 GETs and 1 PUT) at
// the ceiling, in microseconds.
func (r storageResult) GWPerJob() float64 {
	return 2*perOp(r.GetCPU.GW, r.Objects) + perOp(r.PutCPU.GW, r.Objects)
}

// BusyPerJob is the machine's busy CPU per job-equivalent at the ceiling,
// in microseconds.
func (r storageResult) BusyPerJob() float64 {
	if r.GetPerS == 0 || r.PutPerS == 0 {
		return 0
	}
	return 1e6 * (2*r.GetCPU.Busy/r.GetPerS + r.PutCPU.Busy/r.PutPerS)
}

// JobsPerS is the jobs/s that storage alone allows for this shape: a job
// GETs x and dy (w is small and left out, which flatters the ceiling) and
// PUTs one output of x's size.
func (r storageResult) JobsPerS() float64 {
	if r.GetPerS == 0 || r.PutPerS == 0 {
		return 0
	}
	return 1 / (2/r.GetPerS + 1/r.PutPerS)
}

// newMinio returns a client whose transport keeps enough idle connections
// for the bench's concurrency: minio-go's default keeps 16 per host, and
// with 64 handlers each running parallel GETs the rest are dialled and
// closed per request, which the first profile showed as ~20% of the
// worker's CPU (dialConn, persistConn.close). storage/s3 should do the same.
func newMinio(e *env, concurrency int) (*minio.Client, error) {
	tr, err := minio.DefaultTransport(false)
	if err != nil {
		return nil, fmt.Errorf("minio transport: %w", err)
	}
	tr.MaxIdleConns = 4 * concurrency
	tr.MaxIdleConnsPerHost = 4 * concurrency
	c, err := minio.New(e.s3.addr, &minio.Options{
		Creds:     credentials.NewStaticV4(e.accessKey, e.secretKey, ""),
		Secure:    false,
		Transport: tr,
	})
	if err != nil {
		return nil, fmt.Errorf("minio client for %s: %w", e.s3.addr, err)
	}
	return c, nil
}

// benchStorage PUTs n objects of x's size with concurrency workers, then
// GETs them back into per-worker buffers (as the worker reads into pooled
// buffers), and reports both rates.
func benchStorage(ctx context.Context, e *env, mc *minio.Client, s shape, n, concurrency int) (storageResult, error) {
	res := storageResult{Shape: s, Objects: n, Concurrency: concurrency}
	size := s.XBytes()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 131)
	}
	key := func(i int) string { return fmt.Sprintf("ceiling/%s/%06d", s.Name, i) }
	workers := min(concurrency, n)

	run := func(op func(ctx context.Context, i int, buf []byte) error) (time.Duration, error) {
		var next atomic.Int64
		g, gctx := errgroup.WithContext(ctx)
		t0 := time.Now()
		for w := 0; w < workers; w++ {
			g.Go(func() error {
				var buf []byte
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return nil
					}
					if buf == nil {
						buf = make([]byte, size)
					}
					if err := op(gctx, i, buf); err != nil {
						return err
					}
				}
			})
		}
		err := g.Wait()
		return time.Since(t0), err
	}

	c0 := e.snapServers()
	put, err := run(func(ctx context.Context, i int, _ []byte) error {
		_, err := mc.PutObject(ctx, benchBucket, key(i), bytes.NewReader(data), int64(size), putOptions())
		if err != nil {
			return fmt.Errorf("storage ceiling: put %s/%s (%d bytes): %w", benchBucket, key(i), size, err)
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	c1 := e.snapServers()
	res.PutCPU = c1.since(c0)
	get, err := run(func(ctx context.Context, i int, buf []byte) error {
		obj, err := mc.GetObject(ctx, benchBucket, key(i), minio.GetObjectOptions{})
		if err != nil {
			return fmt.Errorf("storage ceiling: get %s/%s: %w", benchBucket, key(i), err)
		}
		defer obj.Close()
		if _, err := io.ReadFull(obj, buf); err != nil {
			return fmt.Errorf("storage ceiling: read %s/%s: %w", benchBucket, key(i), err)
		}
		drain(obj)
		if buf[size-1] != data[size-1] {
			return fmt.Errorf("storage ceiling: %s/%s read back wrong bytes", benchBucket, key(i))
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	res.GetCPU = e.snapServers().since(c1)
	res.PutPerS = float64(n) / put.Seconds()
	res.GetPerS = float64(n) / get.Seconds()
	res.PutGBs = res.PutPerS * float64(size) / 1e9
	res.GetGBs = res.GetPerS * float64(size) / 1e9
	slog.Info("storage ceiling", "shape", s.Name, "bytes", size, "objects", n, "concurrency", concurrency,
		"put_per_s", res.PutPerS, "get_per_s", res.GetPerS, "put_gbs", res.PutGBs, "get_gbs", res.GetGBs)
	// Free the gateway's disk for the next measurement.
	for i := 0; i < n; i++ {
		_ = mc.RemoveObject(ctx, benchBucket, key(i), minio.RemoveObjectOptions{})
	}
	return res, nil
}

// putOptions are the PUT options of both the ceiling and the bench store.
// Over plain HTTP minio-go signs the body in 64 KiB aws-chunked pieces
// (StreamingSignV4: an HMAC-SHA256 per chunk plus a SHA-256 of the data),
// which the first profile showed as ~9% of the worker's CPU. The worker
// already hashes every output tensor (sha256 in the result), so the payload
// goes unsigned; storage/s3 should do the same (or use TLS, where minio-go
// sends UNSIGNED-PAYLOAD anyway).
func putOptions() minio.PutObjectOptions {
	return minio.PutObjectOptions{ContentType: "application/octet-stream", DisableContentSha256: true}
}

// drain reads a response to its end. net/http reuses a connection only
// after its body hit EOF; a ranged read that stops at exactly the range's
// length leaves the body open and Close then drops the connection, so the
// next request dials again (seen in the profile as dialConn and
// persistConn.close).
func drain(r io.Reader) { _, _ = io.Copy(io.Discard, r) }

// storeMixResult is storage through the worker's own store with a small
// job's requests mixed: no queue, no compute.
type storeMixResult struct {
	Jobs     int
	JobsPerS float64
	Servers  serverCPU
}

// benchStoreMix makes s.Jobs small jobs' storage requests through rs (the
// worker's router and S3 store, as cmd/worker wires them) from
// concurrency goroutines, each job in turn: Head and Fetch of x and of dy
// (inputs staged under base; a small object's Head brings its tensor, so
// one GET each) and a Write of dx and dw under a prefix of its own. It is
// the storage side of an end-to-end job without the queue or the compute:
// the end-to-end rate against it tells how much of the gap to the minio-go
// ceiling lies outside storage, and versitygw's CPU per job here against
// the end-to-end rows' tells whether the worker's requests or the load's
// shape cost the server more.
func benchStoreMix(ctx context.Context, e *env, rs routerStore, base string, s shape, concurrency int) (storeMixResult, error) {
	res := storeMixResult{Jobs: s.Jobs}
	out := fmt.Sprintf("%smix-%d/", base, time.Now().UnixNano())
	dt := s.dtype()
	dx := make([]byte, s.XBytes())
	dw := make([]byte, s.Dim*dt.Size())
	var next atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	c0 := e.snapServers()
	t0 := time.Now()
	for range min(concurrency, s.Jobs) {
		g.Go(func() error {
			buf := make([]byte, s.XBytes())
			for {
				i := int(next.Add(1)) - 1
				if i >= s.Jobs {
					return nil
				}
				for _, name := range []string{"x", "dy"} {
					uri := inputURI(base, name, i%s.staged())
					t, err := rs.r.Head(gctx, uri)
					if err != nil {
						return fmt.Errorf("store mix: head %s: %w", uri, err)
					}
					if t.Size != int64(len(buf)) {
						return fmt.Errorf("store mix: %s holds %d bytes, want %d", uri, t.Size, len(buf))
					}
					if err := rs.r.Fetch(gctx, t, buf); err != nil {
						return fmt.Errorf("store mix: fetch %s: %w", uri, err)
					}
				}
				uri := fmt.Sprintf("%s%06d.safetensors", out, i)
				if _, err := rs.r.Write(gctx, uri, []storage.OutTensor{
					{Name: "dx", DType: string(dt), Shape: []int{s.Rows, s.Dim}, Data: dx},
					{Name: "dw", DType: string(dt), Shape: []int{s.Dim}, Data: dw}}, nil); err != nil {
					return fmt.Errorf("store mix: write %s: %w", uri, err)
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return res, err
	}
	res.JobsPerS = float64(s.Jobs) / time.Since(t0).Seconds()
	res.Servers = e.snapServers().since(c0)
	slog.Info("store mix", "shape", s.Name, "jobs", s.Jobs, "jobs_per_s", res.JobsPerS, "gw_us_per_job", perOp(res.Servers.GW, s.Jobs))
	return res, nil
}
