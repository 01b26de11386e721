package faults

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/jobs"
)

// TestKillMultipartDebris SIGKILLs ten workers in turn, each while an
// output's multipart upload has sent part 2 and is half way through part 1
// (a proxy stalls part 1), against each S3 server. The parts sent stay on
// the server as debris of an upload nobody will complete. After recovery
// (a fresh worker; asynq gives the orphaned jobs back, and each writes its
// output again), every job must have completed with the clean run's
// outputs and no byte of debris may be left: no upload in progress of any
// output key, and nothing in the server's multipart staging directory.
// The worker's periodic cleanup (stale_upload_age) is left at its 6 h
// default, so what removes the debris is the recovered job's own upload.
func TestKillMultipartDebris(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: ten SIGKILLs, then asynq's lease recovery (1-2 minutes)")
	}
	t.Parallel()
	for _, kind := range testenv.S3Servers {
		t.Run(kind, func(t *testing.T) { t.Parallel(); killDebris(t, kind) })
	}
}

// debrisOf sums the uploads in progress of the keys and the bytes of
// their parts, through the server's S3 API.
func debrisOf(ctx context.Context, e *Env, keys []string) (uploads int, bytes int64, err error) {
	c, err := e.S3.Client()
	if err != nil {
		return 0, 0, err
	}
	core := minio.Core{Client: c}
	for _, k := range keys {
		res, err := core.ListMultipartUploads(ctx, Bucket, k, "", "", "", 1000)
		if err != nil {
			return 0, 0, err
		}
		for _, u := range res.Uploads {
			if u.Key != k {
				continue
			}
			uploads++
			parts, err := core.ListObjectParts(ctx, Bucket, k, u.UploadID, 0, 1000)
			if err != nil {
				return 0, 0, err
			}
			for _, p := range parts.ObjectParts {
				bytes += p.Size
			}
		}
	}
	return uploads, bytes, nil
}

func killDebris(t *testing.T, kind string) {
	const kills, n = 10, 40
	e := NewEnvOn(t, kind)
	// dx is 12 MiB: with a 6 MiB threshold and 5 MiB parts the output goes
	// up as a multipart upload of two parts, part 2 (7 MiB) first.
	ins := e.Inputs(t, "mp", 61, [2]int{1536, 2048}, [2]int{1536, 2048})
	ids, js, keys := make([]string, n), make([]jobs.Job, n), make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("mp-%s-%02d", kind, i)
		js[i] = ins[i%2].Job(outURI(ids[i]))
		keys[i] = "out/" + ids[i] + ".safetensors"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	if err := e.EnqueueAll(ctx, ids, js, 4); err != nil {
		t.Fatal(err)
	}
	proxy := NewProxy(t, e.S3.Endpoint())
	part1 := func(r *http.Request) bool { return r.URL.Query().Get("partNumber") == "1" }
	cfg := WorkerConfig{S3Endpoint: proxy.Addr, Concurrency: 2, MultipartThreshold: 6 << 20, PartSize: 5 << 20}
	for k := range kills {
		proxy.HoldIf(part1)
		cfg.Name = fmt.Sprintf("k%d", k)
		w := StartWorker(t, workerBin, e, cfg)
		for proxy.Held() < 1 {
			if w.Exited() || ctx.Err() != nil {
				t.Fatalf("kill %d: no part 1 stalled: %s", k, tail(w.Logs()))
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond) // part 2 lands
		w.Kill()
		proxy.Release() // the server sees part 1 cut mid-body
	}
	killedAt := time.Now()
	upBefore, bytesBefore, err := debrisOf(ctx, e, keys)
	if err != nil {
		t.Fatal(err)
	}
	diskBefore, _, err := e.S3.MultipartBytes()
	if err != nil {
		t.Fatal(err)
	}
	if upBefore < kills || bytesBefore < kills*(5<<20) {
		t.Fatalf("after %d kills: %d uploads in progress holding %d bytes: the kills did not land mid-upload", kills, upBefore, bytesBefore)
	}
	wf := StartWorker(t, workerBin, e, WorkerConfig{Name: "final", MultipartThreshold: 6 << 20, PartSize: 5 << 20})
	f, err := e.WaitFinal(ctx, ids)
	if err != nil {
		t.Fatalf("%v; lost %v", err, first(f.Lost, 10))
	}
	recovered := time.Since(killedAt)
	if len(f.Lost) > 0 || len(f.Archived) > 0 {
		t.Fatalf("%d jobs lost (%v), %d archived (%v)", len(f.Lost), first(f.Lost, 5), len(f.Archived), f.Archived)
	}
	for i, id := range ids {
		if err := CheckResult(f.Results[id], ins[i%2], outURI(id)); err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
		if i%8 == 0 {
			if err := e.CheckObject(ctx, ins[i%2], outURI(id)); err != nil {
				t.Fatalf("job %s: %v", id, err)
			}
		}
	}
	upAfter, bytesAfter, err := debrisOf(ctx, e, keys)
	if err != nil {
		t.Fatal(err)
	}
	diskAfter, filesAfter, err := e.S3.MultipartBytes()
	if err != nil {
		t.Fatal(err)
	}
	if upAfter != 0 || bytesAfter != 0 || diskAfter != 0 {
		t.Fatalf("after recovery: %d uploads in progress holding %d bytes, %d bytes in %d files of the server's multipart staging: want none", upAfter, bytesAfter, diskAfter, filesAfter)
	}
	if err := wf.Term(60 * time.Second); err != nil {
		t.Fatalf("final worker after SIGTERM: %v", err)
	}
	mib := func(v int64) float64 { return float64(v) / (1 << 20) }
	t.Logf("FIGURE kill-multipart server=%s kills=%d jobs=%d lost=%d archived=%d debris_uploads_before=%d debris_mib_before=%.1f disk_mib_before=%.1f debris_uploads_after=%d debris_bytes_after=%d disk_bytes_after=%d recovered_s=%.1f",
		kind, kills, n, len(f.Lost), len(f.Archived), upBefore, mib(bytesBefore), mib(diskBefore), upAfter, bytesAfter, diskAfter, recovered.Seconds())
}
