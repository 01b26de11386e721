package jobs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// pinEnv is a handler over a memStore with the given pin cache.
func pinEnv(t *testing.T, pins *PinCache) *handlerEnv {
	t.Helper()
	be := &refBackend{}
	st := newMemStore("mem://ok/")
	b := NewBatcher(be, BatchConfig{MaxJobs: 8, MaxWait: time.Millisecond}, nil, nil)
	t.Cleanup(func() { b.Close(context.Background()) })
	h, err := NewHandler(HandlerConfig{Backend: be, Batcher: b, Store: st, Budget: NewBudget(1 << 30), Worker: "test", Pins: pins})
	if err != nil {
		t.Fatal(err)
	}
	return &handlerEnv{h: h, store: st, be: be, b: b}
}

func (e *handlerEnv) pinOf(uri string) string {
	e.store.mu.Lock()
	defer e.store.mu.Unlock()
	s := sha256.Sum256(e.store.tensors[uri].data)
	return hex.EncodeToString(s[:])
}

func (e *handlerEnv) headsOf(uri string) int {
	e.store.mu.Lock()
	defer e.store.mu.Unlock()
	return e.store.heads[uri]
}

func (e *handlerEnv) outBytes(t *testing.T, uri string) []byte {
	t.Helper()
	e.store.mu.Lock()
	defer e.store.mu.Unlock()
	var b []byte
	for _, o := range e.store.outs[uri] {
		b = append(b, o.Name...)
		b = append(b, o.Data...)
	}
	if len(b) == 0 {
		t.Fatalf("no output at %s", uri)
	}
	return b
}

// A pinned w is read and checked by the first job, then served from the
// pin cache: no Head, the same output bytes as an unpinned job's.
func TestPinnedWServedFromCache(t *testing.T) {
	e := pinEnv(t, NewPinCache(1<<20))
	putInputs(e.store, "mem://ok/a", 1, []int{4, 64})
	putInputs(e.store, "mem://ok/b", 2, []int{4, 64})
	w := "mem://ok/a/w" // both jobs name a's w, as a layer's jobs do
	pin := e.pinOf(w)
	ctx := context.Background()
	run := func(id, prefix, pin string) {
		t.Helper()
		j := testJob(prefix)
		j.W, j.WSHA256, j.Out = w, pin, prefix+"/out-"+id
		if _, err := e.h.process(ctx, id, payload(t, j), nil); err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
	}
	run("1", "mem://ok/a", pin)
	if n := e.headsOf(w); n != 1 {
		t.Fatalf("first pinned job: %d Heads of w, want 1", n)
	}
	if e.h.cfg.Pins.Len() != 1 || e.h.cfg.Pins.Bytes() != 64*4 {
		t.Fatalf("pin cache holds %d tensors, %d bytes; want 1, 256", e.h.cfg.Pins.Len(), e.h.cfg.Pins.Bytes())
	}
	run("2", "mem://ok/b", pin)
	run("3", "mem://ok/a", pin)
	if n := e.headsOf(w); n != 1 {
		t.Fatalf("after three pinned jobs: %d Heads of w, want 1 (the first)", n)
	}
	run("4", "mem://ok/b", "") // unpinned: reads w
	if n := e.headsOf(w); n != 2 {
		t.Fatalf("unpinned job: %d Heads of w, want 2", n)
	}
	if !bytes.Equal(e.outBytes(t, "mem://ok/b/out-2"), e.outBytes(t, "mem://ok/b/out-4")) {
		t.Fatal("the job with w from the pin cache wrote other bytes than the job that read w")
	}
	if !bytes.Equal(e.outBytes(t, "mem://ok/a/out-1"), e.outBytes(t, "mem://ok/a/out-3")) {
		t.Fatal("a job's output changed when its w came from the pin cache")
	}
	if hit, miss := metricValue(t, e.h.m.Pins.WithLabelValues(PinHit)), metricValue(t, e.h.m.Pins.WithLabelValues(PinMiss)); hit != 2 || miss != 1 {
		t.Fatalf("rmsgrad_w_pins_total hit %v miss %v, want 2 and 1", hit, miss)
	}
	if g := metricValue(t, e.h.m.PinBytes); g != 256 {
		t.Fatalf("rmsgrad_pin_cache_bytes = %v, want 256", g)
	}
}

// A w that does not hash to the pin fails its job permanently with both
// digests named, keeps nothing, and leaves jobs beside it alone. A w
// replaced after a pin was kept: jobs that pin the new bytes read them.
func TestPinnedWMismatch(t *testing.T) {
	for _, cache := range []bool{true, false} {
		t.Run(fmt.Sprintf("cache=%v", cache), func(t *testing.T) {
			var pins *PinCache
			if cache {
				pins = NewPinCache(1 << 20)
			}
			e := pinEnv(t, pins)
			ctx := context.Background()
			for i, p := range []string{"a", "b", "c", "d"} {
				putInputs(e.store, "mem://ok/"+p, uint64(i+1), []int{3, 32})
			}
			good := e.pinOf("mem://ok/a/w")
			wrong := e.pinOf("mem://ok/b/w")
			// Four jobs at once, one batch: c's pin is b's w's digest.
			errs := make([]error, 4)
			var wg sync.WaitGroup
			for i, p := range []string{"a", "b", "c", "d"} {
				wg.Go(func() {
					j := testJob("mem://ok/" + p)
					j.WSHA256 = e.pinOf(j.W)
					if p == "c" {
						j.WSHA256 = wrong
					}
					_, errs[i] = e.h.process(ctx, "job-"+p, payload(t, j), nil)
				})
			}
			wg.Wait()
			for i, err := range errs {
				if i == 2 {
					continue
				}
				if err != nil {
					t.Fatalf("job %d beside the mismatched one: %v", i, err)
				}
			}
			err := errs[2]
			if !errors.Is(err, ErrPinMismatch) || !IsPermanent(err) {
				t.Fatalf("mismatch: %v (want ErrPinMismatch, permanent)", err)
			}
			cw := e.pinOf("mem://ok/c/w")
			for _, s := range []string{"job-c", "tensor w", "mem://ok/c/w", cw, wrong, "F32 [32]"} {
				if !strings.Contains(err.Error(), s) {
					t.Fatalf("mismatch error %q does not name %q", err, s)
				}
			}
			if e.h.cfg.Budget.InUse() != 0 {
				t.Fatalf("budget not released: %d", e.h.cfg.Budget.InUse())
			}
			if _, ok := e.h.cfg.Pins.get("mem://ok/c/w", wrong); ok {
				t.Fatal("a w that failed its pin was kept")
			}
			// Replace a's w: a job pinning its new digest reads it; a job
			// pinning the old digest gets the old bytes (cache) or fails.
			putInputs(e.store, "mem://ok/a", 99, []int{3, 32})
			fresh := e.pinOf("mem://ok/a/w")
			j := testJob("mem://ok/a")
			j.WSHA256, j.Out = fresh, "mem://ok/a/out2"
			heads := e.headsOf("mem://ok/a/w")
			if _, err := e.h.process(ctx, "fresh", payload(t, j), nil); err != nil {
				t.Fatalf("job pinning the replaced w: %v", err)
			}
			if e.headsOf("mem://ok/a/w") != heads+1 {
				t.Fatal("a job pinning new bytes did not read w")
			}
			j.WSHA256, j.Out = good, "mem://ok/a/out3"
			_, err = e.h.process(ctx, "old", payload(t, j), nil)
			if cache && err != nil {
				t.Fatalf("job pinning the kept bytes: %v", err)
			}
			if !cache && !errors.Is(err, ErrPinMismatch) {
				t.Fatalf("job pinning the old bytes without a cache: %v, want ErrPinMismatch", err)
			}
		})
	}
}

func TestPinCacheBound(t *testing.T) {
	c := NewPinCache(16 << 10) // entries up to 1 KiB
	if NewPinCache(0) != nil {
		t.Fatal("NewPinCache(0) keeps tensors")
	}
	data := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	c.put("u", "big", "F32", []int{300}, data(1200, 1))
	if c.Len() != 0 {
		t.Fatal("a tensor over a sixteenth of the bound was kept")
	}
	for i := range 20 {
		c.put(fmt.Sprint("u", i), "s", "F32", []int{256}, data(1024, byte(i)))
		if i == 5 {
			if _, ok := c.get("u0", "s"); !ok { // u0 becomes the most recent
				t.Fatal("u0 missing")
			}
		}
	}
	if c.Bytes() > 16<<10 || c.Len() != 16 {
		t.Fatalf("holds %d tensors, %d bytes; want 16 within 16 KiB", c.Len(), c.Bytes())
	}
	if _, ok := c.get("u0", "s"); !ok {
		t.Fatal("the recently used entry was evicted")
	}
	if _, ok := c.get("u1", "s"); ok {
		t.Fatal("the least recently used entry was kept")
	}
	p, ok := c.get("u19", "s")
	if !ok || p.dtype != "F32" || p.shape[0] != 256 || p.data[0] != 19 {
		t.Fatalf("u19: %v %+v", ok, p)
	}
	if _, ok := c.get("u19", "other"); ok {
		t.Fatal("an entry served another pin")
	}
	var nilCache *PinCache
	nilCache.put("u", "s", "F32", []int{1}, data(4, 0))
	if _, ok := nilCache.get("u", "s"); ok || nilCache.Len() != 0 {
		t.Fatal("a nil cache kept something")
	}
}

// metricValue reads a counter's or a gauge's value.
func metricValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Gauge != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}

// TestPinnedWRealParts runs pinned jobs through redis-server, versitygw,
// the storage router and the CPU backend. After the first job kept w, the
// object is rewritten with another w: a job pinning the old bytes still
// completes with the first job's outputs (so it made no read: a read
// would have failed its pin), and a job pinning the new bytes reads them
// and matches an unpinned job's outputs.
func TestPinnedWRealParts(t *testing.T) {
	e := newRealEnv(t, Limits{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	uri := "s3://" + allowedBucket + "/pinned/layer3.safetensors"
	upload := func(seed uint64) string {
		x, w, dy := normal(64, 1), normal(16, seed), normal(64, 3)
		e.putTensors(t, uri, safetensors.F32("x", []int{4, 16}, x), safetensors.F32("w", []int{16}, w), safetensors.F32("dy", []int{4, 16}, dy))
		b := make([]byte, 4*len(w))
		compute.F32.Encode(b, w)
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}
	run := func(name, pin string) []byte {
		t.Helper()
		out := "s3://" + allowedBucket + "/pinned/" + name + ".out"
		id, err := e.client.Enqueue(ctx, Job{X: uri + "#x", W: uri + "#w", DY: uri + "#dy", Out: out, Eps: 1e-6, WSHA256: pin})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.client.Wait(ctx, id); err != nil {
			t.Fatalf("job %s: %v", name, err)
		}
		var got []byte
		for _, n := range []string{"dx", "dw"} {
			ti, err := e.admin.Head(ctx, out+"#"+n)
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, ti.Size)
			if err := e.admin.Fetch(ctx, ti, b); err != nil {
				t.Fatal(err)
			}
			got = append(got, b...)
		}
		return got
	}
	old := upload(2)
	first := run("first", old)
	again := run("again", old)
	if !bytes.Equal(first, again) {
		t.Fatal("a pinned job from the pin cache wrote other bytes than the job that read w")
	}
	fresh := upload(7)
	if fresh == old {
		t.Fatal("the new w has the old digest")
	}
	if got := run("old-pin", old); !bytes.Equal(got, first) {
		t.Fatal("a job pinning the kept w did not get the kept bytes")
	}
	newPinned := run("new-pin", fresh)
	if bytes.Equal(newPinned, first) {
		t.Fatal("a job pinning the rewritten w computed with the old one")
	}
	if unpinned := run("unpinned", ""); !bytes.Equal(unpinned, newPinned) {
		t.Fatal("a pinned job that read w wrote other bytes than an unpinned job")
	}
	hit := counter(t, e.reg, "rmsgrad_w_pins_total", map[string]string{"result": PinHit})
	miss := counter(t, e.reg, "rmsgrad_w_pins_total", map[string]string{"result": PinMiss})
	if hit != 2 || miss != 2 {
		t.Fatalf("rmsgrad_w_pins_total hit %v miss %v, want 2 and 2", hit, miss)
	}
}

// countingStore counts the requests a storage.Store makes (each method
// call is one request on storage/s3's fast path).
type countingStore struct {
	storage.Store
	n atomic.Int64
}

func (c *countingStore) Stat(ctx context.Context, ref storage.Ref) (storage.ObjectInfo, error) {
	c.n.Add(1)
	return c.Store.Stat(ctx, ref)
}

func (c *countingStore) ReadAt(ctx context.Context, ref storage.Ref, etag string, p []byte, off int64) error {
	c.n.Add(1)
	return c.Store.ReadAt(ctx, ref, etag, p, off)
}

func (c *countingStore) ReadAtSized(ctx context.Context, ref storage.Ref, etag string, p []byte, off, size int64) error {
	c.n.Add(1)
	return c.Store.(storage.SizedReader).ReadAtSized(ctx, ref, etag, p, off, size)
}

func (c *countingStore) ReadPrefix(ctx context.Context, ref storage.Ref, p []byte) (int, storage.ObjectInfo, error) {
	c.n.Add(1)
	return c.Store.(storage.PrefixReader).ReadPrefix(ctx, ref, p)
}

func (c *countingStore) Put(ctx context.Context, ref storage.Ref, r io.Reader, size int64) error {
	c.n.Add(1)
	return c.Store.Put(ctx, ref, r, size)
}

// BenchmarkPinnedW runs small jobs (8x1024 F32, the bench's small class),
// one at a time, through the handler, the storage router, storage/s3 and
// a real versitygw, each reading its own x and dy and the layer's w:
// "read" reads w for every job, "pinned" sets w_sha256, so that w comes
// from the pin cache after the first job. One job at a time, no read of w
// is shared with another job's (under load, shared reads serve many of
// them: docs/storage.md), so this is the request pinning saves at its
// whole cost. requests/job counts the store's requests; run with -count
// to alternate the two.
func BenchmarkPinnedW(b *testing.B) {
	const bucket, rows, dim, staged = "tensors", 8, 1024, 16
	srv := testenv.Versitygw(b, bucket)
	ctx := context.Background()
	st, err := s3.New(ctx, s3.Config{Endpoint: srv.Endpoint(), AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Allow: []s3.AllowRule{{Bucket: bucket}}})
	if err != nil {
		b.Fatal(err)
	}
	cs := &countingStore{Store: st}
	r := storage.NewRouter()
	r.Register("s3", cs)
	be := cpu.New()
	defer be.Close()
	base := "s3://" + bucket + "/pinbench/"
	put := func(uri string, shape []int, v []float32) {
		var buf bytes.Buffer
		if err := safetensors.Encode(&buf, []safetensors.Tensor{safetensors.F32("t", shape, v)}, nil); err != nil {
			b.Fatal(err)
		}
		if err := r.Put(ctx, uri, bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
			b.Fatal(err)
		}
	}
	w := normal(dim, 5)
	put(base+"w.safetensors", []int{dim}, w)
	for i := range staged {
		put(fmt.Sprintf("%sx/%d.safetensors", base, i), []int{rows, dim}, normal(rows*dim, uint64(i)))
		put(fmt.Sprintf("%sdy/%d.safetensors", base, i), []int{rows, dim}, normal(rows*dim, uint64(100+i)))
	}
	wb := make([]byte, 4*dim)
	compute.F32.Encode(wb, w)
	sum := sha256.Sum256(wb)
	pin := hex.EncodeToString(sum[:])
	for _, mode := range []string{"read", "pinned"} {
		b.Run(mode, func(b *testing.B) {
			bt := NewBatcher(be, BatchConfig{MaxJobs: 1, MaxWait: time.Millisecond}, nil, nil)
			defer bt.Close(ctx)
			h, err := NewHandler(HandlerConfig{Backend: be, Batcher: bt, Store: routerAdapter{r}, Budget: NewBudget(1 << 30), Pins: NewPinCache(DefaultPinCacheBytes)})
			if err != nil {
				b.Fatal(err)
			}
			job := func(i int) {
				k := i % staged
				j := Job{V: Version, X: fmt.Sprintf("%sx/%d.safetensors", base, k), W: base + "w.safetensors", DY: fmt.Sprintf("%sdy/%d.safetensors", base, k),
					Out: fmt.Sprintf("%sout/%s/%d.safetensors", base, mode, k), Eps: 1e-6}
				if mode == "pinned" {
					j.WSHA256 = pin
				}
				p, err := j.Payload()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := h.process(ctx, "bench", p, nil); err != nil {
					b.Fatal(err)
				}
			}
			job(0) // the pinned mode's first read of w, and warm pools
			n0 := cs.n.Load()
			b.ResetTimer()
			for i := range b.N {
				job(i + 1)
			}
			b.StopTimer()
			b.ReportMetric(float64(cs.n.Load()-n0)/float64(b.N), "requests/job")
		})
	}
}
