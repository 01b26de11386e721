package s3

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"hash"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/minio/minio-go/v7"
)

// fastGet is the read fast path (Config.DisableFastPath turns it off): a
// minimal HTTP/1.1 client for the store's GETs, range GETs and HEADs over a
// pool of keep-alive connections. net/http and minio-go allocate about 15 KiB
// per request (request and response objects, header maps, a goroutine per
// connection, minio-go's URL and signing strings), which is half of a 32 KiB
// tensor; this client writes the request, SigV4-signed with the day key and
// HMAC state cached per connection, from a reused buffer, parses the status
// line and the few headers it needs from the connection's bufio.Reader, and
// reads the body straight into the caller's buffer: no allocation per GET.
//
// It serves only the plain case: a 200 or 206 answer with a Content-Length.
// A HEAD's Content-Length is the object's size; no body follows it.
// Error answers (non-2xx with a small body) are decoded into the
// minio.ErrorResponse that minio-go would have returned, so classify sees
// the same error. Anything else (redirects, chunked or unsized bodies,
// headers it cannot parse) returns errFallback and the caller sends that
// request through minio-go. A connection that saw any error, a body left
// unread, a Connection: close or a cancelled context is closed, never pooled.
type fastGet struct {
	addr   string      // dial address: the endpoint
	host   string      // Host header and the signed host
	tls    *tls.Config // nil: plain HTTP
	access string
	keys   *dayKeys // nil: anonymous requests, unsigned
	region string
	stall  time.Duration
	idle   int // pool size
	dialer net.Dialer

	mu   sync.Mutex
	pool []*fconn // LIFO: the most recently used on top

	trace *fastTrace // tests (export_test.go)

	dials, fallbacks atomic.Int64 // for tests and debugging
}

// fastTrace lets tests see the fast path's requests as their tap transport
// sees minio-go's.
type fastTrace struct {
	request func(method, bucket, key, rng string, status int) // once per request, status 0 when none came
	body    func(n int)                                       // body bytes read (error bodies and dropped prefixes too)
	wrote   func(off, n int64) error                          // PUT body bytes [off, off+n) about to be sent; an error cuts the body there
}

// fastIdleTimeout drops pooled connections idle this long (minio-go's
// transport uses the same): servers close them sooner or later.
const fastIdleTimeout = time.Minute

// errFallback sends a request through minio-go: the fast path met a
// response it does not handle. The connection is closed.
var errFallback = errors.New("s3: fast path: fall back to minio-go")

// fconn is one pooled connection with its buffers and the state of the
// response being read.
type fconn struct {
	nc   net.Conn
	br   *bufio.Reader
	req  []byte    // the request is written from here
	sb   []byte    // canonical request and string to sign
	sha  hash.Hash // of the canonical request
	mac  hash.Hash // HMAC-SHA256 with the day key of macDay
	day  [8]byte
	sum  [sha256.Size]byte
	kick func() // ctx cancelled: fail the blocked I/O
	stop func() bool
	used time.Time // put back in the pool at

	// the response
	status  int
	clen    int64 // Content-Length, -1 when absent
	total   int64 // the object's size from Content-Range, -1 when absent
	badCR   bool  // Content-Range present but malformed
	chunked bool
	close   bool
	etag    []byte // without quotes
	left    int64  // body bytes not read yet
	dl      time.Time
}

// aLongTimeAgo is a deadline that makes blocked I/O return at once.
var aLongTimeAgo = time.Unix(1, 0)

func newFastGet(cfg Config, region string, tlsCfg *tls.Config, keys *dayKeys, stall time.Duration) *fastGet {
	idle := cfg.MaxIdleConns
	if idle <= 0 {
		idle = 256
	}
	f := &fastGet{addr: cfg.Endpoint, host: cfg.Endpoint, access: cfg.AccessKey, keys: keys, region: region,
		stall: stall, idle: idle, dialer: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}}
	if cfg.TLS {
		t := tlsCfg.Clone()
		if t == nil {
			t = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if t.ServerName == "" {
			h, _, err := net.SplitHostPort(cfg.Endpoint)
			if err != nil {
				h = cfg.Endpoint
			}
			t.ServerName = h
		}
		f.tls = t
	}
	return f
}

// get takes a pooled connection (fresh enough) or nil.
func (f *fastGet) get(now time.Time) *fconn {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.pool) > 0 {
		c := f.pool[len(f.pool)-1]
		f.pool[len(f.pool)-1] = nil
		f.pool = f.pool[:len(f.pool)-1]
		if now.Sub(c.used) < fastIdleTimeout {
			return c
		}
		c.nc.Close()
	}
	return nil
}

func (f *fastGet) dial(ctx context.Context) (*fconn, error) {
	f.dials.Add(1)
	nc, err := f.dialer.DialContext(ctx, "tcp", f.addr)
	if err != nil {
		return nil, err
	}
	if f.tls != nil {
		tc := tls.Client(nc, f.tls)
		nc.SetDeadline(time.Now().Add(f.stall)) // a server that accepts and says nothing is a stall
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
		nc = tc
	}
	c := &fconn{nc: nc, br: bufio.NewReaderSize(nc, 16<<10), req: make([]byte, 0, 1024), sb: make([]byte, 0, 512),
		sha: sha256.New(), etag: make([]byte, 0, 128)}
	c.kick = func() { c.nc.SetDeadline(aLongTimeAgo) }
	return c, nil
}

// release ends c's request: back to the pool when its response was read
// whole and nothing broke it, closed otherwise.
func (f *fastGet) release(c *fconn, ok bool) {
	if c.stop != nil {
		if !c.stop() {
			ok = false // the context fired: c's deadline is in the past
		}
		c.stop = nil
	}
	if !ok || c.close || c.left != 0 {
		c.nc.Close()
		return
	}
	c.used = time.Now()
	f.mu.Lock()
	if len(f.pool) < f.idle {
		f.pool = append(f.pool, c)
		c = nil
	}
	f.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
}

// open sends a GET (or HEAD) of /bucket/key, with Range: bytes=from-to
// when to >= 0 and If-Match when pin is set, and reads the response head.
// On success the body (c.left bytes) is next on c, and the caller must
// release c. A reused connection that the server had closed is replaced by
// a fresh one.
func (f *fastGet) open(ctx context.Context, method, bucket, key string, from, to int64, pin string) (*fconn, error) {
	c, err := f.exchange(ctx, method, bucket, key, from, to, func(c *fconn, now time.Time) (bool, error) {
		return f.roundTrip(ctx, c, now, method, bucket, key, from, to, pin)
	})
	if err != nil {
		return nil, err
	}
	if c.status == http.StatusOK || c.status == http.StatusPartialContent {
		if c.chunked || c.clen < 0 {
			f.release(c, false)
			f.fallbacks.Add(1)
			return nil, errFallback
		}
		return c, nil
	}
	return nil, f.errorResponse(c, method, bucket, key)
}

// exchange is one request of the fast path (GET, HEAD or PUT) on a pooled
// or freshly dialled connection: send writes the request on c and reads
// the response head, fresh when it failed before any byte of a response.
// A reused connection that the server closed while idle fails that way,
// and the request goes again on another (nothing was processed). On
// success c has its head read, and the caller must release it.
func (f *fastGet) exchange(ctx context.Context, method, bucket, key string, from, to int64,
	send func(c *fconn, now time.Time) (fresh bool, err error)) (*fconn, error) {
	for tries := 0; ; tries++ {
		now := time.Now()
		c := f.get(now)
		reused := c != nil
		if c == nil {
			var err error
			if c, err = f.dial(ctx); err != nil {
				f.traceRequest(method, bucket, key, from, to, 0)
				return nil, err
			}
		}
		fresh, err := send(c, now)
		if err == nil {
			f.traceRequest(method, bucket, key, from, to, c.status)
			return c, nil
		}
		f.release(c, false)
		if reused && fresh && tries <= f.idle && ctx.Err() == nil && stale(err) {
			continue // the server closed it while it was idle
		}
		if errors.Is(err, errFallback) {
			f.fallbacks.Add(1)
		} else {
			f.traceRequest(method, bucket, key, from, to, 0)
		}
		return nil, err
	}
}

// stale says whether err is what a connection closed by the server while
// idle gives on its next request.
func stale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED)
}

func (f *fastGet) traceRequest(method, bucket, key string, from, to int64, status int) {
	if f.trace == nil {
		return
	}
	rng := ""
	if to >= 0 {
		rng = "bytes=" + strconv.FormatInt(from, 10) + "-" + strconv.FormatInt(to, 10)
	}
	f.trace.request(method, bucket, key, rng, status)
}

// roundTrip writes the request and parses the response head. fresh is
// true when the error came before any byte of a response.
func (f *fastGet) roundTrip(ctx context.Context, c *fconn, now time.Time, method, bucket, key string, from, to int64, pin string) (fresh bool, err error) {
	if !utf8.ValidString(key) {
		return true, errFallback // minio-go sends such keys unencoded
	}
	if ctx.Done() != nil {
		c.stop = context.AfterFunc(ctx, c.kick)
	}
	c.dl = time.Time{}
	if err := c.deadline(ctx, now, f.stall, true); err != nil {
		return true, err
	}
	b := f.request(c, now, method, bucket, key, from, to, pin)
	if _, err := c.nc.Write(b); err != nil {
		return true, err
	}
	fresh, err = c.readHead()
	if method == http.MethodHead {
		c.left = 0 // the Content-Length is the object's; no body follows
	}
	return fresh, err
}

// deadline sets c's deadline to the earlier of the context's and a stall
// timeout from now. Reads refresh it once stall/8 passed since it was set,
// so it lies stall/8 further out: a body is aborted after at least stall,
// at most 9/8 stall, without bytes.
func (c *fconn) deadline(ctx context.Context, now time.Time, stall time.Duration, both bool) error {
	d := now.Add(stall + stall/8)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	var err error
	if both {
		err = c.nc.SetDeadline(d)
	} else {
		err = c.nc.SetReadDeadline(d)
	}
	c.dl = now
	if err != nil {
		return err
	}
	// A cancellation that ran its kick before this Set would be undone by
	// it: look again (cancel marks ctx done before it runs the kick).
	if ctx.Done() != nil {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// request builds the request into c.req: path-style URL, SigV4 with an
// unsigned payload (host, x-amz-content-sha256 and x-amz-date signed, as
// readSigner does).
func (f *fastGet) request(c *fconn, now time.Time, method, bucket, key string, from, to int64, pin string) []byte {
	b, p0, p1 := f.requestLine(c, method, bucket, key)
	if to >= 0 {
		b = append(b, "Range: bytes="...)
		b = strconv.AppendInt(b, from, 10)
		b = append(b, '-')
		b = strconv.AppendInt(b, to, 10)
		b = append(b, "\r\n"...)
	}
	if pin != "" {
		b = append(b, "If-Match: \""...)
		b = append(b, pin...)
		b = append(b, "\"\r\n"...)
	}
	return f.endRequest(c, b, now, method, b[p0:p1], "")
}

// requestLine starts a request in c.req: the request line (path-style
// URL), Host and User-Agent. path is b[p0:p1].
func (f *fastGet) requestLine(c *fconn, method, bucket, key string) (b []byte, p0, p1 int) {
	b = append(c.req[:0], method...)
	b = append(b, ' ')
	p0 = len(b)
	b = append(b, '/')
	b = append(b, bucket...)
	b = append(b, '/')
	b = appendEncodedPath(b, key)
	p1 = len(b)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, f.host...)
	b = append(b, "\r\nUser-Agent: rmsgrad-s3\r\n"...)
	return b, p0, p1
}

// endRequest appends the date and Authorization headers (when the store
// signs), ends the head and keeps b as c.req. crc is the PUT's CRC32C
// header value ("" for a GET or HEAD).
func (f *fastGet) endRequest(c *fconn, b []byte, now time.Time, method string, path []byte, crc string) []byte {
	if f.keys != nil {
		b = append(b, "X-Amz-Content-Sha256: "+unsignedPayload+"\r\nX-Amz-Date: "...)
		s0 := len(b)
		b = appendAmzDate(b, now)
		stamp := b[s0:len(b):len(b)]
		b = append(b, "\r\n"...)
		b = f.sign(c, b, method, stamp, path, crc)
	}
	b = append(b, "\r\n"...)
	c.req = b
	return b
}

// sign appends the Authorization header line for a request of path at
// stamp; a PUT (crc set) also signs its Content-Type and CRC32C headers.
func (f *fastGet) sign(c *fconn, b []byte, method string, stamp, path []byte, crc string) []byte {
	day := [8]byte(stamp[:8])
	if c.mac == nil || c.day != day {
		c.mac = hmac.New(sha256.New, f.keys.get(string(day[:])))
		c.day = day
	}
	s := append(c.sb[:0], method...)
	s = append(s, '\n')
	s = append(s, path...)
	s = append(s, "\n\n"...)
	signed := fastSignedHeaders
	if crc != "" {
		s = append(s, "content-type:"+putContentType+"\n"...)
		signed = putSignedHeaders
	}
	s = append(s, "host:"...)
	s = append(s, f.host...)
	if crc != "" {
		s = append(s, "\nx-amz-checksum-crc32c:"...)
		s = append(s, crc...)
	}
	s = append(s, "\nx-amz-content-sha256:"+unsignedPayload+"\nx-amz-date:"...)
	s = append(s, stamp...)
	s = append(s, "\n\n"...)
	s = append(s, signed...)
	s = append(s, "\n"+unsignedPayload...)
	sum := c.sum[:0] // a local array would escape through the hash.Hash interface
	c.sha.Reset()
	c.sha.Write(s)
	sum = c.sha.Sum(sum)
	s = append(s[:0], "AWS4-HMAC-SHA256\n"...)
	s = append(s, stamp...)
	s = append(s, '\n')
	sc := len(s)
	s = append(s, day[:]...)
	s = append(s, '/')
	s = append(s, f.region...)
	s = append(s, "/s3/aws4_request"...)
	scope := s[sc:]
	s = append(s, '\n')
	s = hex.AppendEncode(s, sum)
	c.mac.Reset()
	c.mac.Write(s)
	sum = c.mac.Sum(sum[:0])
	c.sb = s
	b = append(b, "Authorization: AWS4-HMAC-SHA256 Credential="...)
	b = append(b, f.access...)
	b = append(b, '/')
	b = append(b, scope...)
	b = append(b, ", SignedHeaders="...)
	b = append(b, signed...)
	b = append(b, ", Signature="...)
	b = hex.AppendEncode(b, sum)
	return append(b, "\r\n"...)
}

const (
	fastSignedHeaders = "host;x-amz-content-sha256;x-amz-date"
	putSignedHeaders  = "content-type;host;x-amz-checksum-crc32c;x-amz-content-sha256;x-amz-date"
	putContentType    = "application/octet-stream"
)

// appendEncodedPath is s3utils.EncodePath without allocating: every byte
// but A-Z a-z 0-9 - _ . ~ / percent-encoded (UTF-8 bytes, upper-case hex).
func appendEncodedPath(b []byte, s string) []byte {
	const hexUpper = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if 'A' <= ch && ch <= 'Z' || 'a' <= ch && ch <= 'z' || '0' <= ch && ch <= '9' ||
			ch == '-' || ch == '_' || ch == '.' || ch == '~' || ch == '/' {
			b = append(b, ch)
			continue
		}
		b = append(b, '%', hexUpper[ch>>4], hexUpper[ch&15])
	}
	return b
}

// readHead parses the status line and the headers the fast path uses.
func (c *fconn) readHead() (fresh bool, err error) {
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		if len(line) == 0 {
			return true, err
		}
		return false, fastIOErr(err)
	}
	// "HTTP/1.1 206 Partial Content\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return false, errFallback
	}
	c.status = 0
	for _, d := range line[9:12] {
		if d < '0' || d > '9' {
			return false, errFallback
		}
		c.status = c.status*10 + int(d-'0')
	}
	c.close = line[7] != '1' // HTTP/1.0: one request per connection
	c.clen, c.total, c.badCR, c.chunked, c.etag = -1, -1, false, false, c.etag[:0]
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return false, fastIOErr(err)
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 {
			return false, errFallback
		}
		k, v := line[:i], bytes.TrimSpace(line[i+1:])
		switch {
		case asciiEqualFold(k, "Content-Length"):
			n, ok := parseDec(v)
			if !ok {
				return false, errFallback
			}
			c.clen = n
		case asciiEqualFold(k, "Content-Range"):
			// bytes a-b/total
			j := bytes.LastIndexByte(v, '/')
			n, ok := parseDec(v[j+1:])
			if j < 0 || !ok {
				c.badCR = true
			} else {
				c.total = n
			}
		case asciiEqualFold(k, "ETag"):
			v = bytes.TrimPrefix(bytes.TrimSuffix(v, []byte{'"'}), []byte{'"'})
			c.etag = append(c.etag[:0], v...)
		case asciiEqualFold(k, "Transfer-Encoding"):
			c.chunked = !asciiEqualFold(v, "identity")
		case asciiEqualFold(k, "Connection"):
			if containsFold(v, "close") {
				c.close = true
			}
		}
	}
	c.left = max(c.clen, 0)
	return false, nil
}

// fastIOErr turns a header line too long for the buffer into a fallback.
func fastIOErr(err error) error {
	if errors.Is(err, bufio.ErrBufferFull) {
		return errFallback
	}
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

func containsFold(b []byte, s string) bool {
	for i := 0; i+len(s) <= len(b); i++ {
		if asciiEqualFold(b[i:i+len(s)], s) {
			return true
		}
	}
	return false
}

// parseDec parses a non-negative decimal that fits an int64.
func parseDec(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, false
		}
		n = n*10 + int64(d-'0')
	}
	return n, true
}

// etagString is the response's ETag (it allocates: only when needed).
func (c *fconn) etagString() string { return string(c.etag) }

// read fills p from the body, refreshing the stall deadline as bytes
// arrive; it returns how many bytes it read.
func (f *fastGet) read(ctx context.Context, c *fconn, p []byte) (int, error) {
	if int64(len(p)) > c.left {
		p = p[:c.left] // the caller checked the length: never read past the body
	}
	done := 0
	for done < len(p) {
		if now := time.Now(); now.Sub(c.dl) > f.stall/8 {
			if err := c.deadline(ctx, now, f.stall, false); err != nil {
				return done, err
			}
		}
		n, err := c.br.Read(p[done:])
		done += n
		c.left -= int64(n)
		if f.trace != nil && n > 0 {
			f.trace.body(n)
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return done, err
		}
	}
	return done, nil
}

// discard drops n body bytes.
func (f *fastGet) discard(ctx context.Context, c *fconn, n int64) error {
	for n > 0 {
		if err := c.deadline(ctx, time.Now(), f.stall, false); err != nil {
			return err
		}
		k, err := c.br.Discard(int(min(n, 1<<20)))
		n -= int64(k)
		c.left -= int64(k)
		if f.trace != nil && k > 0 {
			f.trace.body(k)
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// maxErrorBody is the largest error body the fast path reads (S3 error
// documents are a few hundred bytes); larger ones fall back.
const maxErrorBody = 64 << 10

// errorResponse reads a non-2xx answer's body and returns the
// minio.ErrorResponse minio-go's GetObject returns for it
// (httpRespToErrorResponse), or errFallback for what it does not handle.
// It releases c.
func (f *fastGet) errorResponse(c *fconn, method, bucket, key string) error {
	head := method == http.MethodHead // no body: the status says it all
	if c.status < 400 || c.status > 599 || !head && (c.chunked || c.clen > maxErrorBody || (c.clen < 0 && !c.close)) {
		f.release(c, false)
		f.fallbacks.Add(1)
		return errFallback
	}
	var body []byte
	var err error
	switch {
	case head:
	case c.clen >= 0:
		body = make([]byte, c.clen)
		_, err = io.ReadFull(c.br, body)
		c.left = 0
	default:
		body, err = io.ReadAll(io.LimitReader(c.br, maxErrorBody))
	}
	if f.trace != nil {
		f.trace.body(len(body))
	}
	status := c.status
	f.release(c, err == nil) // c may serve another request from here on
	if err != nil {
		return fastIOErr(err)
	}
	er := minio.ErrorResponse{}
	if xml.Unmarshal(body, &er) != nil {
		er = minio.ErrorResponse{BucketName: bucket, Key: key}
		switch status {
		case http.StatusNotFound:
			er.Code, er.Message = "NoSuchKey", "The specified key does not exist."
		case http.StatusForbidden:
			er.Code, er.Message = "AccessDenied", "Access Denied."
		case http.StatusConflict:
			er.Code, er.Message, er.Key = "Conflict", "Bucket not empty.", ""
		case http.StatusPreconditionFailed:
			er.Code, er.Message = "PreconditionFailed", "Pre condition failed."
		default:
			text := strconv.Itoa(status) + " " + http.StatusText(status)
			er.Code, er.Message, er.Key = text, text, ""
			if b := strings.TrimSpace(string(body)); b != "" {
				er.Message = b[:min(len(b), 1024)]
			}
		}
	}
	er.StatusCode = status
	return er
}

// dayKeys derives the SigV4 signing key once a day: it depends only on the
// secret, the day and the region.
type dayKeys struct {
	secret, region string

	mu  sync.Mutex
	day string
	key []byte
}

func (k *dayKeys) get(day string) []byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.day != day {
		d := hmacSum([]byte("AWS4"+k.secret), day)
		d = hmacSum(d, k.region)
		d = hmacSum(d, "s3")
		k.key, k.day = hmacSum(d, "aws4_request"), day
	}
	return k.key
}
