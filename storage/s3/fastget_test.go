package s3_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// fetchBack writes ts to uri and returns a function that fetches tensor
// name into a fresh buffer and checks its bytes.
func fetchBack(t *testing.T, r *storage.Router, uri string, ts []storage.OutTensor) func(ctx context.Context, name string) error {
	t.Helper()
	if _, err := r.Write(context.Background(), uri, ts, nil); err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context, name string) error {
		ti, err := r.Head(ctx, uri+"#"+name)
		if err != nil {
			return err
		}
		dst := make([]byte, ti.Size)
		if err := r.Fetch(ctx, ti, dst); err != nil {
			return err
		}
		for _, x := range ts {
			if x.Name == name && !bytes.Equal(dst, x.Data) {
				t.Fatalf("%s: fetched other bytes", name)
			}
		}
		return nil
	}
}

// TestFastPathPool: GETs go through the fast path (no fallback), reuse
// one pooled connection when sequential, and survive the server closing
// its connections between requests (a gateway restart, and versitygw's
// default of one response per connection).
func TestFastPathPool(t *testing.T) { eachServer(t, testFastPathPool) }

func testFastPathPool(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	tp := newTap()
	st := newStore(t, gw, func(c *s3.Config) { c.Transport = tp })
	r := newRouter(st)
	ts := []storage.OutTensor{tensor("x", 256, 1024, 1), tensor("w", 1, 1024, 2), tensor("dy", 300, 1024, 3)}
	fetch := fetchBack(t, r, "s3://data/t/fast.safetensors", ts)
	for range 3 {
		for _, x := range ts {
			if err := fetch(ctx, x.Name); err != nil {
				t.Fatal(err)
			}
		}
	}
	dials, fallbacks := s3.FastCounts(st)
	if dials != 1 || fallbacks != 0 || s3.FastIdle(st) != 1 {
		t.Errorf("sequential fetches: %d dials, %d fallbacks, %d idle: want one pooled connection and no fallback", dials, fallbacks, s3.FastIdle(st))
	}
	if n := len(tp.matching("GET ")); n < 4 {
		t.Errorf("the tap saw %d GETs: the fast path's trace is not wired", n)
	}

	// The gateway restarts: the pooled connection is dead. The next GET
	// notices before any response byte and redials, without an attempt
	// of the retry loop (the tap sees one request).
	gw.Kill()
	gw.Start()
	waitServing(t, gw, "s3://data/t/fast.safetensors#dy")
	tp.reset()
	if err := fetch(ctx, "dy"); err != nil {
		t.Fatalf("fetch after a restart: %v", err)
	}
	if got := tp.matching(""); len(got) != 2 { // the Head's HEAD (cached header) and the GET
		t.Errorf("after a restart: requests %v (statuses %v), want one HEAD and one GET", got, tp.statuses())
	}
	if d, _ := s3.FastCounts(st); d != 2 {
		t.Errorf("%d dials after a restart, want 2", d)
	}

	// Without VGW_KEEP_ALIVE versitygw answers each request on its own
	// connection and closes it.
	t.Setenv("VGW_KEEP_ALIVE", "")
	gw1 := gateway(t, kind)
	st1 := newStore(t, gw1, nil)
	fetch1 := fetchBack(t, newRouter(st1), "s3://data/t/fast1.safetensors", ts)
	for range 2 {
		for _, x := range ts {
			if err := fetch1(ctx, x.Name); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, fb := s3.FastCounts(st1); fb != 0 {
		t.Errorf("%d fallbacks against a closing server", fb)
	}
}

// oddProxy passes requests to a gateway and answers GETs in ways the fast
// path must not take at face value: a chunked body (falls back to
// minio-go, whose answer the store rejects as before: a tensor read needs
// a sized body), a body cut off mid-way (resumed), Connection: close
// (read, then not pooled).
type oddProxy struct {
	*httptest.Server
	mu   sync.Mutex
	mode string // "", "chunked", "cut", "close": applies to GETs
}

func newOddProxy(t *testing.T, gw *testenv.S3) *oddProxy {
	up, _ := url.Parse("http://" + gw.Endpoint())
	rp := httputil.NewSingleHostReverseProxy(up)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	p := &oddProxy{}
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodGet || resp.StatusCode >= 300 {
			return nil
		}
		p.mu.Lock()
		mode := p.mode
		if mode == "cut" {
			p.mode = "" // once: the resumed GET gets the rest
		}
		p.mu.Unlock()
		switch mode {
		case "chunked":
			resp.Header.Del("Content-Length")
			resp.ContentLength = -1
		case "cut":
			resp.Body = &cutReader{r: resp.Body, left: resp.ContentLength / 2}
		case "close":
			resp.Header.Set("Connection", "close")
		}
		return nil
	}
	p.Server = httptest.NewServer(rp)
	t.Cleanup(p.Close)
	return p
}

func (p *oddProxy) set(mode string) {
	p.mu.Lock()
	p.mode = mode
	p.mu.Unlock()
}

// cutReader ends a body with an error after left bytes: the reverse proxy
// then aborts the connection mid-body.
type cutReader struct {
	r    io.ReadCloser
	left int64
}

func (c *cutReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, errors.New("cut")
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *cutReader) Close() error { return c.r.Close() }

// TestFastPathOddAnswers: chunked answers go through minio-go, cut bodies
// resume from where they stopped, Connection: close is honoured; bytes are
// right whenever the fetch succeeds.
func TestFastPathOddAnswers(t *testing.T) { eachServer(t, testFastPathOddAnswers) }

func testFastPathOddAnswers(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	p := newOddProxy(t, gw)
	tp := newTap()
	st := newStore(t, gw, func(c *s3.Config) { c.Endpoint = strings.TrimPrefix(p.URL, "http://"); c.Transport = tp })
	r := newRouter(st)
	ts := []storage.OutTensor{tensor("x", 512, 1024, 4), tensor("w", 1, 1024, 5)}
	fetch := fetchBack(t, r, "s3://data/t/odd.safetensors", ts)
	if err := fetch(ctx, "w"); err != nil { // caches the header
		t.Fatal(err)
	}
	for _, c := range []struct {
		mode            string
		gets, fallbacks int64 // GETs the tap sees for one fetch of x; fallbacks added
		dials           int64 // connections dialed
	}{
		{"", 1, 0, 0},
		{"chunked", 2, 1, 0}, // the fast GET on the pooled connection (then closed), then minio-go's
		{"cut", 2, 0, 2},     // the cut GET on a new connection, then the rest of x on another
		{"close", 1, 0, 0},   // pooled after the resume; read whole, then closed
		{"", 1, 0, 1},        // a fresh connection after close
		{"", 1, 0, 0},        // pooled again
	} {
		p.set(c.mode)
		tp.reset()
		d0, f0 := s3.FastCounts(st)
		err := fetch(ctx, "x")
		if c.mode == "chunked" {
			// minio-go's answer, as without the fast path: a body of
			// unknown length is not taken for the tensor's bytes.
			if !errors.Is(err, storage.ErrShortRead) || !strings.Contains(err.Error(), "returned -1 bytes") {
				t.Errorf("mode chunked: %v, want minio-go's ErrShortRead for an unsized body", err)
			}
		} else if err != nil {
			t.Fatalf("mode %q: %v", c.mode, err)
		}
		d1, f1 := s3.FastCounts(st)
		gets := tp.matching("GET ")
		if int64(len(gets)) != c.gets || f1-f0 != c.fallbacks || d1-d0 != c.dials {
			t.Errorf("mode %q: GETs %v, %d fallbacks, %d dials; want %d GETs, %d fallbacks, %d dials", c.mode, gets, f1-f0, d1-d0, c.gets, c.fallbacks, c.dials)
		}
		if c.mode == "cut" && len(gets) == 2 && !strings.Contains(gets[1], "bytes=") {
			t.Errorf("mode cut: GETs %v, want the second to resume with a range", gets)
		}
	}
}

// TestFastPathContext: a deadline that passes while a body is stalled ends
// the fetch with DeadlineExceeded (not a stall, not permanent), and a
// cancelled context before the request is returned as is; the connections
// involved are not pooled.
func TestFastPathContext(t *testing.T) { eachServer(t, testFastPathContext) }

func testFastPathContext(t *testing.T, kind string) {
	gw := gateway(t, kind)
	p := newFaultProxy(t, gw)
	st := proxiedStore(t, gw, p, func(c *s3.Config) { c.StallTimeout = 10 * time.Second })
	r := newRouter(st)
	x := tensor("x", 1024, 1024, 6)
	fetch := fetchBack(t, r, "s3://data/t/ctx.safetensors", []storage.OutTensor{x})
	if err := fetch(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	ti, err := r.Head(context.Background(), "s3://data/t/ctx.safetensors#x")
	if err != nil {
		t.Fatal(err)
	}
	p.queue(fault{stall: 1 << 20})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err = r.Fetch(ctx, ti, make([]byte, ti.Size))
	if el := time.Since(t0); el > 3*time.Second {
		t.Errorf("Fetch returned %v after its deadline", el)
	}
	if !errors.Is(err, context.DeadlineExceeded) || storage.Permanent(err) {
		t.Errorf("Fetch past its deadline mid-body = %v, want DeadlineExceeded", err)
	}
	if n := s3.FastIdle(st); n != 0 {
		t.Errorf("%d idle connections after a timed-out body: the broken one was pooled", n)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if err := r.Fetch(ctx, ti, make([]byte, ti.Size)); !errors.Is(err, context.Canceled) {
		t.Errorf("Fetch with a cancelled context = %v, want Canceled", err)
	}
	// A live cancellable context: the GET succeeds and its connection is
	// pooled (the AfterFunc was stopped in time).
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	dst := make([]byte, ti.Size)
	if err := r.Fetch(ctx, ti, dst); err != nil || !bytes.Equal(dst, x.Data) {
		t.Fatalf("Fetch with a live context: %v", err)
	}
	if n := s3.FastIdle(st); n != 1 {
		t.Errorf("%d idle connections after a GET under a cancellable context, want 1", n)
	}
}

// TestFastPathTLS: the fast path speaks TLS to an HTTPS versitygw with the
// store's CA file, reusing the connection.
func TestFastPathTLS(t *testing.T) {
	ctx := context.Background()
	t.Setenv("VGW_KEEP_ALIVE", "true")
	f := testenv.NewTLS(t)
	gw := testenv.VersitygwTLS(t, f, testBuckets...)
	st := newStore(t, gw, func(c *s3.Config) { c.TLS = true; c.CAFile = f.CAFile })
	fetch := fetchBack(t, newRouter(st), "s3://data/t/tls.safetensors", []storage.OutTensor{tensor("x", 256, 1024, 7), tensor("w", 1, 1024, 8)})
	for range 3 {
		if err := fetch(ctx, "x"); err != nil {
			t.Fatal(err)
		}
	}
	if d, fb := s3.FastCounts(st); d != 1 || fb != 0 {
		t.Errorf("TLS: %d dials, %d fallbacks; want one connection, no fallback", d, fb)
	}
	// A client that does not trust the server's certificate fails, and
	// says why.
	bad := newStore(t, gw, func(c *s3.Config) { c.TLS = true; c.Backoff = storage.Backoff{Attempts: 1} })
	if err := bad.ReadAt(ctx, storage.Ref{Scheme: "s3", Bucket: "data", Key: "t/tls.safetensors"}, "", make([]byte, 8), 0); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("GET without the CA = %v, want a certificate error", err)
	}
}

// TestFastPathOff: with DisableFastPath every GET goes through minio-go.
func TestFastPathOff(t *testing.T) { eachServer(t, testFastPathOff) }

func testFastPathOff(t *testing.T, kind string) {
	gw := gateway(t, kind)
	st := newStore(t, gw, func(c *s3.Config) { c.DisableFastPath = true })
	if s3.FastIdle(st) != -1 {
		t.Fatal("DisableFastPath left the fast path on")
	}
	fetch := fetchBack(t, newRouter(st), "s3://data/t/off.safetensors", []storage.OutTensor{tensor("x", 16, 1024, 9)})
	if err := fetch(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
}

// TestFastPathPut: a single PUT of a Write body goes through the fast
// path from the compute buffers (one PUT, no fallback, the connection
// pooled for the reads that follow) and reads back byte for byte; a large
// body cut off mid-way by a dying sender leaves the old object.
func TestFastPathPut(t *testing.T) { eachServer(t, testFastPathPut) }

func testFastPathPut(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	tp := newTap()
	st := newStore(t, gw, func(c *s3.Config) { c.Transport = tp })
	r := newRouter(st)
	x := tensor("dx", 256, 1024, 10)
	tp.reset()
	res, err := r.Write(ctx, "s3://data/t/fastput.safetensors", []storage.OutTensor{x}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := tp.matching(""); len(got) != 1 || got[0] != "PUT /data/t/fastput.safetensors" || tp.wroteBytes.Load() != res.Bytes {
		t.Errorf("Write made requests %v sending %d body bytes, want one PUT of %d", got, tp.wroteBytes.Load(), res.Bytes)
	}
	if _, fb := s3.FastCounts(st); fb != 0 || s3.FastIdle(st) != 1 {
		t.Errorf("%d fallbacks, %d idle connections after a PUT: want none and the connection pooled", fb, s3.FastIdle(st))
	}
	ti, err := r.Head(ctx, "s3://data/t/fastput.safetensors#dx")
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, ti.Size)
	if err := r.Fetch(ctx, ti, dst); err != nil || !bytes.Equal(dst, x.Data) {
		t.Fatalf("read back: %v", err)
	}
	if d, _ := s3.FastCounts(st); d != 1 {
		t.Errorf("%d dials for a PUT and the reads after it, want 1", d)
	}
	// A sender dying half way through the body: Write fails, the old
	// object stays.
	s3.SetFastWrote(st, func(off, n int64) error {
		if off+n > int64(len(x.Data))/2 {
			return errors.New("sender died mid-body")
		}
		return nil
	})
	if _, err := r.Write(ctx, "s3://data/t/fastput.safetensors", []storage.OutTensor{tensor("dx", 256, 1024, 11)}, nil); err == nil {
		t.Fatal("a Write cut half way succeeded")
	}
	s3.SetFastWrote(st, nil)
	if err := r.Fetch(ctx, ti, dst); err != nil || !bytes.Equal(dst, x.Data) {
		t.Fatalf("after a cut Write the object is not the old one: %v", err)
	}
}
