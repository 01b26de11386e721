package s3_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// killSize is the tensor the kill tests move: large enough that the kill
// lands mid-transfer, smaller under -short.
func killRows() int {
	if testing.Short() {
		return 8192 // 32 MiB
	}
	return 32768 // 128 MiB
}

// patient rides out a gateway restart (~0.5 s down).
var patient = storage.Backoff{Attempts: 40, Base: 50 * time.Millisecond, Max: 400 * time.Millisecond}

// killAt returns a hook that SIGKILLs gw from inside the transfer (the
// reading or writing goroutine blocks until the process is gone) and a
// channel closed once it is dead.
func killAt(gw *testenv.S3, after int64) (*hook, chan struct{}) {
	dead := make(chan struct{})
	return &hook{after: after, fn: func() { gw.Kill(); close(dead) }}, dead
}

// TestKillDuringFetch: the gateway is killed a quarter into a large ranged
// read and restarted; the read resumes where it stopped (a later GET asks
// for the rest) and the buffer holds exactly the tensor's bytes.
func TestKillDuringFetch(t *testing.T) { eachServer(t, testKillDuringFetch) }

func testKillDuringFetch(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	tp := newTap()
	r := newRouter(newStore(t, gw, func(c *s3.Config) { c.Transport = tp; c.Backoff = patient }))
	uri := "s3://data/t/kill-fetch.safetensors"
	x := tensor("x", killRows(), 1024, 21)
	res, err := r.Write(ctx, uri, []storage.OutTensor{tensor("w", 1, 1024, 20), x}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ti, err := r.Head(ctx, uri+"#x")
	if err != nil {
		t.Fatal(err)
	}
	tp.reset()
	h, dead := killAt(gw, ti.Size/4)
	tp.onRead = h
	done := make(chan error, 1)
	dst := make([]byte, ti.Size)
	go func() { done <- r.Fetch(ctx, ti, dst) }()
	<-dead
	time.Sleep(300 * time.Millisecond)
	gw.Start()
	if err := <-done; err != nil {
		t.Fatalf("Fetch across a gateway restart: %v", err)
	}
	if sum(dst) != res.SHA256["x"] {
		t.Fatal("Fetch across a gateway restart returned other bytes")
	}
	gets := tp.matching("GET ")
	if len(gets) < 2 {
		t.Fatalf("GETs %v: the kill did not interrupt the read", gets)
	}
	// x is the object's tail: the first GET is of the whole object, the
	// retries ask for the rest of x from where the body stopped.
	last := gets[len(gets)-1]
	i := strings.Index(last, "bytes=")
	if strings.Contains(gets[0], "bytes=") || i < 0 {
		t.Fatalf("GETs %v: want a whole-object GET, then ranged resumes", gets)
	}
	from, err := strconv.ParseInt(strings.Split(last[i+6:], "-")[0], 10, 64)
	if err != nil || from <= ti.Offset+ti.Size/8 || from >= ti.Offset+ti.Size {
		t.Errorf("GETs %v: the last should resume inside x, well past its start %d", gets, ti.Offset)
	}
	t.Logf("%d requests: %v", len(tp.matching("")), gets)
}

// TestKillDuringFetchStaysDown: with the gateway gone for good the read
// fails with a transient ErrUnavailable after its retries; it never
// reports success with a short buffer.
func TestKillDuringFetchStaysDown(t *testing.T) { eachServer(t, testKillDuringFetchStaysDown) }

func testKillDuringFetchStaysDown(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	tp := newTap()
	r := newRouter(newStore(t, gw, func(c *s3.Config) {
		c.Transport = tp
		c.Backoff = storage.Backoff{Attempts: 4, Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	}))
	uri := "s3://data/t/kill-down.safetensors"
	if _, err := r.Write(ctx, uri, []storage.OutTensor{tensor("x", 8192, 1024, 22)}, nil); err != nil {
		t.Fatal(err)
	}
	ti, err := r.Head(ctx, uri+"#x")
	if err != nil {
		t.Fatal(err)
	}
	tp.reset()
	tp.onRead, _ = killAt(gw, ti.Size/4)
	err = r.Fetch(ctx, ti, make([]byte, ti.Size))
	if !errors.Is(err, storage.ErrUnavailable) || storage.Permanent(err) || !strings.Contains(err.Error(), "gave up after 4 attempts") {
		t.Errorf("Fetch with the gateway killed = %v, want transient ErrUnavailable after 4 attempts", err)
	}
	if !strings.Contains(err.Error(), uri+"#x") {
		t.Errorf("error does not name the tensor URI: %v", err)
	}
}

// TestKillDuringWrite: the gateway is killed while a multipart upload and
// while a single PUT are sending, then restarted; Write starts the upload
// again from the compute buffers and the object reads back whole.
func TestKillDuringWrite(t *testing.T) { eachServer(t, testKillDuringWrite) }

func testKillDuringWrite(t *testing.T, kind string) {
	for _, c := range []struct {
		name      string
		rows      int
		multipart bool
	}{
		{"multipart", killRows(), true},
		{"single PUT", 2048, false}, // 8 MiB, under the multipart threshold
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			gw := gateway(t, kind)
			tp := newTap()
			st := newStore(t, gw, func(cfg *s3.Config) {
				cfg.Transport = tp
				cfg.Backoff = patient
				cfg.MultipartThreshold = 16 << 20 // the 32 MiB object of -short too
			})
			r := newRouter(st)
			uri := "s3://data/t/kill-write.safetensors"
			x := tensor("dx", c.rows, 1024, 23)
			h, dead := killAt(gw, int64(len(x.Data))/3)
			tp.onWrite = h
			done := make(chan error, 1)
			var res storage.WriteResult
			go func() {
				var err error
				res, err = r.Write(ctx, uri, []storage.OutTensor{x}, nil)
				done <- err
			}()
			<-dead
			time.Sleep(300 * time.Millisecond)
			gw.Start()
			if err := <-done; err != nil {
				t.Fatalf("Write across a gateway restart: %v", err)
			}
			if c.multipart {
				if n := len(tp.matching("POST ", "uploads")); n < 2 {
					t.Errorf("%d CreateMultipartUploads: the upload was not started again", n)
				}
			} else if n := len(tp.matching("PUT ")); n < 2 {
				t.Errorf("%d PUTs: the upload was not sent again", n)
			}
			ti, err := r.Head(ctx, uri+"#dx")
			if err != nil {
				t.Fatal(err)
			}
			dst := make([]byte, ti.Size)
			if err := r.Fetch(ctx, ti, dst); err != nil {
				t.Fatal(err)
			}
			if sum(dst) != sum(x.Data) || res.SHA256["dx"] != sum(x.Data) {
				t.Error("the object written across a restart reads back other bytes")
			}
		})
	}
}

// TestKillDuringWriteStaysDown: a write that cannot finish fails with a
// transient error, and readers still see the previous object whole.
func TestKillDuringWriteStaysDown(t *testing.T) { eachServer(t, testKillDuringWriteStaysDown) }

func testKillDuringWriteStaysDown(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	tp := newTap()
	r := newRouter(newStore(t, gw, func(c *s3.Config) {
		c.Transport = tp
		c.Backoff = storage.Backoff{Attempts: 3, Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	}))
	uri := "s3://data/t/kill-keep.safetensors"
	old := tensor("dx", 64, 1024, 24)
	if _, err := r.Write(ctx, uri, []storage.OutTensor{old}, nil); err != nil {
		t.Fatal(err)
	}
	x := tensor("dx", killRows(), 1024, 25)
	tp.onWrite, _ = killAt(gw, int64(len(x.Data))/3+tp.wroteBytes.Load())
	_, err := r.Write(ctx, uri, []storage.OutTensor{x}, nil)
	if !errors.Is(err, storage.ErrUnavailable) || storage.Permanent(err) {
		t.Fatalf("Write with the gateway killed = %v, want transient ErrUnavailable", err)
	}
	gw.Start()
	ti, err := r.Head(ctx, uri+"#dx")
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, ti.Size)
	if err := r.Fetch(ctx, ti, dst); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, old.Data) {
		t.Error("after a failed write the object is not the previous one")
	}
}

// TestCancelMidTransfer: cancelling the context stops a large read and a
// large write promptly; neither is permanent, and the cancelled write
// leaves no object.
func TestCancelMidTransfer(t *testing.T) { eachServer(t, testCancelMidTransfer) }

func testCancelMidTransfer(t *testing.T, kind string) {
	gw := gateway(t, kind)
	tp := newTap()
	r := newRouter(newStore(t, gw, func(c *s3.Config) { c.Transport = tp; c.Backoff = patient }))
	uri := "s3://data/t/cancel.safetensors"
	x := tensor("x", 8192, 1024, 26)
	if _, err := r.Write(context.Background(), uri, []storage.OutTensor{x}, nil); err != nil {
		t.Fatal(err)
	}
	ti, err := r.Head(context.Background(), uri+"#x")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tp.reset()
	tp.onRead = &hook{after: 4 << 20, fn: cancel}
	err = r.Fetch(ctx, ti, make([]byte, ti.Size))
	if !errors.Is(err, context.Canceled) || storage.Permanent(err) {
		t.Errorf("Fetch cancelled mid-read = %v, want context.Canceled", err)
	}
	if n := len(tp.matching("GET ")); n != 1 {
		t.Errorf("%d GETs: a cancelled read was retried", n)
	}
	ctx, cancel = context.WithCancel(context.Background())
	tp.reset()
	tp.onWrite = &hook{after: 4 << 20, fn: cancel}
	out := "s3://data/t/cancel-out.safetensors"
	_, err = r.Write(ctx, out, []storage.OutTensor{x}, nil)
	if !errors.Is(err, context.Canceled) || storage.Permanent(err) {
		t.Errorf("Write cancelled mid-upload = %v, want context.Canceled", err)
	}
	if _, err := r.Head(context.Background(), out+"#x"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("a cancelled Write left an object: Head = %v", err)
	}
}
