package s3_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// faultProxy sits between the store and a real versitygw. Requests pass
// through unchanged unless a fault is queued: then the proxy answers with
// that S3 error itself (as a load balancer or an overloaded gateway would),
// or stalls a response body half way until the client gives up.
type faultProxy struct {
	*httptest.Server
	mu       sync.Mutex
	faults   []fault
	requests atomic.Int64
}

type fault struct {
	status int
	code   string
	stall  int64 // > 0: pass the request through but stop the body after this many bytes
}

func newFaultProxy(t *testing.T, gw *testenv.S3) *faultProxy {
	t.Helper()
	up, _ := url.Parse("http://" + gw.Endpoint())
	rp := httputil.NewSingleHostReverseProxy(up) // keeps the Host header the request was signed for
	rp.ErrorLog = log.New(io.Discard, "", 0)     // stalled bodies end in copy errors by design
	p := &faultProxy{}
	rp.ModifyResponse = func(resp *http.Response) error {
		if v := resp.Request.Context().Value(stallKey{}); v != nil {
			resp.Body = &stallBody{r: resp.Body, left: v.(int64), done: resp.Request.Context().Done()}
		}
		return nil
	}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		p.mu.Lock()
		var f *fault
		if len(p.faults) > 0 {
			f = &p.faults[0]
			p.faults = p.faults[1:]
		}
		p.mu.Unlock()
		switch {
		case f == nil:
			rp.ServeHTTP(w, r)
		case f.stall > 0:
			rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), stallKey{}, f.stall)))
		default:
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(f.status)
			if r.Method != http.MethodHead {
				fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected by the test proxy</Message></Error>`, f.code)
			}
		}
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *faultProxy) queue(fs ...fault) {
	p.mu.Lock()
	p.faults = append(p.faults, fs...)
	p.mu.Unlock()
	p.requests.Store(0)
}

type stallKey struct{}

type stallBody struct {
	r    io.ReadCloser
	left int64
	done <-chan struct{}
}

func (s *stallBody) Read(p []byte) (int, error) {
	if s.left <= 0 {
		<-s.done // hang until the client hangs up
		return 0, errors.New("client went away")
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	n, err := s.r.Read(p)
	s.left -= int64(n)
	return n, err
}

func (s *stallBody) Close() error { return s.r.Close() }

func proxiedStore(t *testing.T, gw *testenv.S3, p *faultProxy, edit func(*s3.Config)) *s3.Store {
	return newStore(t, gw, func(c *s3.Config) {
		c.Endpoint = strings.TrimPrefix(p.URL, "http://")
		if edit != nil {
			edit(c)
		}
	})
}

// TestRetryClassification: 5xx, 429 and stalls are retried (and a read
// resumes where it stopped); 4xx are not: one request, a permanent error.
func TestRetryClassification(t *testing.T) { eachServer(t, testRetryClassification) }

func testRetryClassification(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	p := newFaultProxy(t, gw)
	tp := newTap()
	st := proxiedStore(t, gw, p, func(c *s3.Config) { c.StallTimeout = time.Second; c.Transport = tp })
	r := newRouter(st)
	uri := "s3://data/t/retry.safetensors"
	x := tensor("x", 1024, 1024, 3) // 4 MiB
	if _, err := r.Write(ctx, uri, []storage.OutTensor{x}, nil); err != nil {
		t.Fatal(err)
	}
	ti, err := r.Head(ctx, uri+"#x")
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := storage.ParseRef(uri)
	fetch := func() error {
		dst := make([]byte, ti.Size)
		err := r.Fetch(ctx, ti, dst)
		if err == nil && !bytes.Equal(dst, x.Data) {
			t.Fatal("Fetch returned other bytes after retries")
		}
		return err
	}
	stat := func() error { _, err := st.Stat(ctx, ref); return err }
	write := func() error {
		_, err := r.Write(ctx, uri, []storage.OutTensor{x}, nil)
		return err
	}
	for _, c := range []struct {
		name     string
		faults   []fault
		op       func() error
		is       error // nil: success
		requests int64
	}{
		{"503 then ok (stat)", []fault{{503, "SlowDown", 0}, {503, "SlowDown", 0}}, stat, nil, 3},
		{"500 then ok (fetch)", []fault{{500, "InternalError", 0}}, fetch, nil, 2},
		{"502, 504, 429 then ok (write)", []fault{{502, "BadGateway", 0}, {504, "GatewayTimeout", 0}, {429, "SlowDown", 0}}, write, nil, 4},
		{"stalled body resumes (fetch)", []fault{{0, "", 1 << 20}, {0, "", 2 << 20}}, fetch, nil, 3},
		{"503 until attempts run out", []fault{{503, "ServiceUnavailable", 0}, {503, "ServiceUnavailable", 0}, {503, "ServiceUnavailable", 0}, {503, "ServiceUnavailable", 0}, {503, "ServiceUnavailable", 0}, {503, "ServiceUnavailable", 0}}, fetch, storage.ErrUnavailable, 6},
		{"400 not retried", []fault{{400, "InvalidRequest", 0}}, fetch, storage.ErrRejected, 1},
		{"403 not retried", []fault{{403, "AccessDenied", 0}}, write, storage.ErrAccess, 1},
		{"404 not retried", []fault{{404, "NoSuchKey", 0}}, fetch, storage.ErrNotFound, 1},
		{"412 not retried by the store", []fault{{412, "PreconditionFailed", 0}}, fetch, storage.ErrChanged, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			p.queue(c.faults...)
			tp.reset()
			err := c.op()
			if n := p.requests.Load(); n != c.requests {
				t.Errorf("%d requests reached the proxy, want %d", n, c.requests)
			}
			if c.is == nil {
				if err != nil {
					t.Fatalf("want success after retries, got %v", err)
				}
				if c.faults[0].stall > 0 {
					// The first GET is of the whole object (x is its tail behind
					// a small header); each retry resumes where the stalled body
					// stopped, never from the start: the proxy stalls after 1 MiB
					// of the object, then after 2 MiB more. How much of a stalled
					// body reaches the reader before the stall watchdog fires
					// depends on scheduling (a loaded machine can hold the last
					// bytes back), so each resume must start after the previous
					// one and no later than the proxy's stall point; Fetch's
					// bytes are compared above, so nothing may be skipped.
					end := ti.Offset + ti.Size - 1
					got := tp.matching("GET ")
					ok := len(got) == 3 && got[0] == "GET /data/t/retry.safetensors"
					prev := int64(0)
					for k, stall := range []int64{c.faults[0].stall, c.faults[1].stall} {
						if !ok {
							break
						}
						var from, to int64
						_, err := fmt.Sscanf(got[k+1][strings.LastIndex(got[k+1], " bytes=")+1:], "bytes=%d-%d", &from, &to)
						ok = err == nil && from > prev && from <= prev+stall && to == end
						prev = from
					}
					if !ok {
						t.Errorf("GETs %v: want the whole object, then two ranges to byte %d, each resuming after the previous start and no later than the stall point (1 MiB, then 2 MiB more)", got, end)
					}
				}
				return
			}
			if !errors.Is(err, c.is) {
				t.Fatalf("got %v, want %v", err, c.is)
			}
			wantPermanent := c.is != storage.ErrUnavailable && c.is != storage.ErrChanged
			if storage.Permanent(err) != wantPermanent {
				t.Errorf("Permanent(%v) = %v, want %v", err, storage.Permanent(err), wantPermanent)
			}
			if c.is == storage.ErrUnavailable && !strings.Contains(err.Error(), "gave up after 6 attempts") {
				t.Errorf("error does not say it retried: %v", err)
			}
		})
	}
	p.queue()
}

// TestRefusedConnection: a gateway that is down (connection refused) is
// retried with backoff until the attempts run out; when it comes back up
// within the retries, the call succeeds.
func TestRefusedConnection(t *testing.T) { eachServer(t, testRefusedConnection) }

func testRefusedConnection(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	r0 := newRouter(newStore(t, gw, nil))
	uri := "s3://data/t/refused.safetensors"
	x := tensor("x", 64, 64, 1)
	if _, err := r0.Write(ctx, uri, []storage.OutTensor{x}, nil); err != nil {
		t.Fatal(err)
	}
	gw.Kill()
	tp := newTap()
	st := newStore(t, gw, func(c *s3.Config) {
		c.Transport = tp
		c.Backoff = storage.Backoff{Attempts: 4, Base: 10 * time.Millisecond, Max: 40 * time.Millisecond}
	})
	r := newRouter(st)
	_, err := r.Head(ctx, uri+"#x")
	if !errors.Is(err, storage.ErrUnavailable) || storage.Permanent(err) || !strings.Contains(err.Error(), "gave up after 4 attempts") {
		t.Errorf("Head with the gateway down = %v, want transient ErrUnavailable after 4 attempts", err)
	}
	if n := len(tp.matching("")); n != 4 {
		t.Errorf("%d attempts, want 4", n)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) && !strings.Contains(err.Error(), "refused") {
		t.Errorf("error does not say the connection was refused: %v", err)
	}
	// Back up during the retries: the call succeeds.
	st2 := newStore(t, gw, func(c *s3.Config) {
		c.Backoff = storage.Backoff{Attempts: 40, Base: 50 * time.Millisecond, Max: 250 * time.Millisecond}
	})
	done := make(chan error, 1)
	go func() {
		ti, err := newRouter(st2).Head(ctx, uri+"#x")
		if err == nil {
			dst := make([]byte, ti.Size)
			if err = newRouter(st2).Fetch(ctx, ti, dst); err == nil && !bytes.Equal(dst, x.Data) {
				err = errors.New("other bytes")
			}
		}
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	gw.Start()
	if err := <-done; err != nil {
		t.Errorf("Head+Fetch while the gateway restarts: %v", err)
	}
}

// TestContextDuringRetries: a deadline ends the backoff between retries;
// the error is the context's, not permanent.
func TestContextDuringRetries(t *testing.T) { eachServer(t, testContextDuringRetries) }

func testContextDuringRetries(t *testing.T, kind string) {
	gw := gateway(t, kind)
	gw.Kill()
	st := newStore(t, gw, func(c *s3.Config) {
		c.Backoff = storage.Backoff{Attempts: 100, Base: time.Second, Max: 10 * time.Second}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := newRouter(st).Head(ctx, "s3://data/t/x.safetensors#x")
	if el := time.Since(t0); el > 3*time.Second {
		t.Errorf("Head returned after %v, past its 300 ms deadline", el)
	}
	if !errors.Is(err, context.DeadlineExceeded) || storage.Permanent(err) {
		t.Errorf("Head past its deadline = %v, want DeadlineExceeded, not permanent", err)
	}
}
