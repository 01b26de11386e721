package s3

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/rmsgrad/rmsgrad/storage"
)

// AllowRule lets the store use one bucket, or only the keys under Prefixes
// in it (a key matches when it starts with one of them; end a prefix with
// "/" to mean a directory).
type AllowRule struct {
	Bucket   string
	Prefixes []string // empty: the whole bucket
	ReadOnly bool     // reads only: writes are ErrNotAllowed
}

// Config configures the S3 store. Endpoint and Allow are required.
type Config struct {
	Endpoint  string // host:port, no scheme
	Region    string // "" means us-east-1 (what versitygw and MinIO use by default)
	AccessKey string
	SecretKey string
	TLS       bool   // https
	CAFile    string // PEM bundle to trust instead of the system roots (TLS only)
	Allow     []AllowRule

	// MultipartThreshold: objects up to it go up in one PUT, larger ones
	// as a multipart upload of PartSize parts. 0 means 128 MiB. One PUT
	// streams into the object; a multipart upload costs the server a copy
	// of every part into the object at completion (versitygw: 30-80 ms per
	// 64 MiB on a 2-core host, where one PUT of a 64 MiB output measured
	// 100-107% of minio-go's multipart PutObject and our multipart upload
	// 79-91%; storage/s3 BenchmarkWrite). Lower it for links where one
	// connection is slow and parallel parts pay.
	MultipartThreshold uint64
	// PartSize is the multipart part size. 0 means minio-go's default
	// (16 MiB).
	PartSize uint64
	// Backoff is the retry policy for transient failures; the zero value
	// means storage.DefaultBackoff.
	Backoff storage.Backoff
	// StallTimeout aborts and retries (from where it stopped) a read that
	// got no bytes for this long: a gateway that hangs without closing the
	// connection is a transient failure, not a hung worker. 0 means 30 s.
	StallTimeout time.Duration
	// SignPayload signs PUT bodies over plain HTTP (aws-chunked, a SHA-256
	// of the data and an HMAC per 64 KiB chunk). Off by default: Write
	// already records a sha256 of every tensor, and it costs ~10% of a
	// worker's CPU (cmd/bench profile). Over TLS minio-go never signs
	// payloads.
	SignPayload bool
	// MaxIdleConns is the idle connection pool per host; 0 means 256. The
	// transport default (16) makes busy workers dial and close a connection
	// per request.
	MaxIdleConns int
	// Transport overrides the HTTP transport of minio-go's requests (tests);
	// nil builds one from the fields above. The read fast path dials its
	// own connections.
	Transport http.RoundTripper
	// DisableFastPath sends every request through minio-go and net/http.
	// By default the store's GETs, range GETs and HEADs, and its single
	// PUTs, go through a minimal HTTP/1.1 client (fastget.go, fastput.go):
	// no allocation per read, no copy of a PUT body. A request whose answer
	// it does not handle is sent again through minio-go. It is off anyway
	// when an HTTP proxy applies to the endpoint or the endpoint is one
	// minio-go addresses virtual-host style (AWS, GCS, Aliyun); PUTs stay
	// on minio-go with SignPayload.
	DisableFastPath bool
}

// Store is the S3 store.
type Store struct {
	core      minio.Core // writes: minio-go's own signing
	rcore     minio.Core // reads (GET, HEAD): signed by readSigner, see sign.go
	fast      *fastGet   // GETs, HEADs, single PUTs; nil: off (see Config.DisableFastPath)
	allow     []AllowRule
	part      uint64
	threshold uint64 // Config.MultipartThreshold
	backoff   storage.Backoff
	stall     time.Duration
	sign      bool
	host      string
}

var _ storage.Store = (*Store)(nil)

// New builds the store. It does no I/O (the endpoint may come up later);
// the first request reports bad credentials as ErrAccess.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("s3: endpoint is required")
	}
	if strings.Contains(cfg.Endpoint, "://") {
		return nil, fmt.Errorf("s3: endpoint %q: give host:port without a scheme (TLS selects https)", cfg.Endpoint)
	}
	if len(cfg.Allow) == 0 {
		return nil, errors.New("s3: the allow-list is empty: name at least one bucket")
	}
	for i, a := range cfg.Allow {
		if err := s3utils.CheckValidBucketName(a.Bucket); err != nil {
			return nil, fmt.Errorf("s3: allow[%d]: bucket %q: %w", i, a.Bucket, err)
		}
	}
	if (cfg.AccessKey == "") != (cfg.SecretKey == "") {
		return nil, errors.New("s3: access key and secret key go together")
	}
	if cfg.PartSize != 0 && (cfg.PartSize < minPart || cfg.PartSize > maxPut) {
		return nil, fmt.Errorf("s3: part size %d bytes: S3 takes parts of 5 MiB (%d) to 5 GiB (%d)", cfg.PartSize, minPart, uint64(maxPut))
	}
	if cfg.MultipartThreshold > maxPut {
		return nil, fmt.Errorf("s3: multipart threshold %d bytes: over S3's largest single PUT, 5 GiB (%d)", cfg.MultipartThreshold, uint64(maxPut))
	}
	var tlsCfg *tls.Config
	if cfg.CAFile != "" {
		if !cfg.TLS {
			return nil, errors.New("s3: ca_file is set but TLS is off")
		}
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("s3: ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("s3: ca_file %s holds no PEM certificates", cfg.CAFile)
		}
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	tr := cfg.Transport
	if tr == nil {
		t, err := minio.DefaultTransport(cfg.TLS)
		if err != nil {
			return nil, fmt.Errorf("s3: transport: %w", err)
		}
		idle := cfg.MaxIdleConns
		if idle <= 0 {
			idle = 256
		}
		t.MaxIdleConns, t.MaxIdleConnsPerHost = idle, idle
		if tlsCfg != nil {
			if t.TLSClientConfig == nil {
				t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
			}
			t.TLSClientConfig.RootCAs = tlsCfg.RootCAs
		}
		if t.TLSClientConfig != nil {
			tlsCfg = t.TLSClientConfig
		}
		tr = t
	}
	var creds *credentials.Credentials
	if cfg.AccessKey != "" {
		creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	} else {
		creds = credentials.New(&credentials.Static{}) // anonymous
	}
	region := cfg.Region
	if region == "" {
		region = "us-east-1"
	}
	client := func(creds *credentials.Credentials, tr http.RoundTripper) (*minio.Client, error) {
		c, err := minio.New(cfg.Endpoint, &minio.Options{
			Creds:     creds,
			Secure:    cfg.TLS,
			Region:    region,
			Transport: tr,
			// Retries are ours (storage.Retry), with our classification and
			// resumable reads; minio-go's own would multiply with them.
			MaxRetries: 1,
			// Lets a single PUT carry an x-amz-checksum-crc32c header (see
			// Put): minio-go refuses checksum headers without it.
			TrailingHeaders: true,
		})
		if err != nil {
			return nil, fmt.Errorf("s3: client for %s: %w", cfg.Endpoint, err)
		}
		return c, nil
	}
	c, err := client(creds, tr)
	if err != nil {
		return nil, err
	}
	rc := c
	var keys *dayKeys
	if cfg.AccessKey != "" {
		keys = &dayKeys{secret: cfg.SecretKey, region: region}
		rs := &readSigner{next: tr, access: cfg.AccessKey, region: region, keys: keys}
		if rc, err = client(credentials.New(&credentials.Static{}), rs); err != nil {
			return nil, err
		}
	}
	b := cfg.Backoff
	if b == (storage.Backoff{}) {
		b = storage.DefaultBackoff
	}
	stall := cfg.StallTimeout
	if stall <= 0 {
		stall = 30 * time.Second
	}
	st := &Store{core: minio.Core{Client: c}, rcore: minio.Core{Client: rc}, allow: cfg.Allow, part: cfg.PartSize, threshold: cfg.MultipartThreshold, backoff: b,
		stall: stall, sign: cfg.SignPayload, host: cfg.Endpoint}
	if !cfg.DisableFastPath && fastReadsApply(c, tr) {
		st.fast = newFastGet(cfg, region, tlsCfg, keys, stall)
	}
	return st, nil
}

// fastReadsApply says whether the read fast path can send what minio-go
// would: not through a proxy (HTTP_PROXY and the like), not virtual-host
// style.
func fastReadsApply(c *minio.Client, tr http.RoundTripper) bool {
	u := c.EndpointURL()
	if s3utils.IsAmazonEndpoint(*u) || s3utils.IsGoogleEndpoint(*u) || s3utils.IsAliyunOSSEndpoint(*u) {
		return false
	}
	if t, ok := tr.(*http.Transport); ok && t.Proxy != nil {
		p, err := t.Proxy(&http.Request{Method: http.MethodGet, URL: u, Host: u.Host})
		if err != nil || p != nil {
			return false
		}
	}
	return true
}

// Client returns the underlying minio-go client (benchmarks compare with it).
func (s *Store) Client() *minio.Client { return s.core.Client }

// listed reports whether bucket is in the allow-list.
func (s *Store) listed(bucket string) bool {
	for _, a := range s.allow {
		if a.Bucket == bucket {
			return true
		}
	}
	return false
}

// Check applies the allow-list to ref without I/O.
func (s *Store) Check(ref storage.Ref, write bool) error {
	if ref.Scheme != "s3" {
		return storage.Errorf(storage.ErrInvalidURI, "the s3 store serves s3:// URIs, not %s://", ref.Scheme)
	}
	// New checked the allow-list's bucket names: only another needs the
	// check (a regexp match, whose deep stack grew the fresh goroutines
	// that run every Fetch and Write).
	if !s.listed(ref.Bucket) {
		if err := s3utils.CheckValidBucketName(ref.Bucket); err != nil {
			return storage.Errorf(storage.ErrInvalidURI, "bucket name: %v", err)
		}
	}
	if err := s3utils.CheckValidObjectName(ref.Key); err != nil {
		return storage.Errorf(storage.ErrInvalidURI, "object key: %v", err)
	}
	for rest := ref.Key; ; {
		seg, after, more := strings.Cut(rest, "/")
		if seg == "" || seg == "." || seg == ".." {
			return storage.Errorf(storage.ErrNotAllowed, "key %q has an empty, . or .. segment", ref.Key)
		}
		if !more {
			break
		}
		rest = after
	}
	bucketListed := false
	for _, a := range s.allow {
		if a.Bucket != ref.Bucket {
			continue
		}
		bucketListed = true
		if len(a.Prefixes) > 0 && !hasAnyPrefix(ref.Key, a.Prefixes) {
			continue
		}
		if write && a.ReadOnly {
			continue
		}
		return nil
	}
	if !bucketListed {
		return storage.Errorf(storage.ErrNotAllowed, "bucket %q is not in the allow-list (storage.s3.allow)", ref.Bucket)
	}
	if write {
		return storage.Errorf(storage.ErrNotAllowed, "key %q is outside the prefixes this worker may write in bucket %q (storage.s3.allow)", ref.Key, ref.Bucket)
	}
	return storage.Errorf(storage.ErrNotAllowed, "key %q is outside the prefixes this worker may read in bucket %q (storage.s3.allow)", ref.Key, ref.Bucket)
}

func hasAnyPrefix(key string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// transient marks an error worth retrying.
type transient struct{ err error }

func (t *transient) Error() string { return t.err.Error() }
func (t *transient) Unwrap() error { return t.err }

func retryable(err error) bool {
	if err == nil {
		return false // t below escapes to the heap: not on the success path
	}
	var t *transient
	return errors.As(err, &t)
}

// accessCodes are the S3 error codes that mean the credentials or the
// policy are wrong, whatever the HTTP status.
var accessCodes = map[string]bool{
	"AccessDenied": true, "InvalidAccessKeyId": true, "SignatureDoesNotMatch": true,
	"XAdminUserNotFound": true, "InvalidToken": true, "ExpiredToken": true,
	"AuthorizationHeaderMalformed": true, "AllAccessDisabled": true, "AccountProblem": true,
}

// classify maps a minio-go or transport error to the storage sentinels and
// marks the transient ones.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	resp := minio.ToErrorResponse(err)
	if resp.StatusCode != 0 || resp.Code != "" {
		msg := resp.Code
		if resp.Message != "" {
			msg += ": " + resp.Message
		}
		switch {
		// Credential codes first: versitygw answers an unknown access key
		// with 404 XAdminUserNotFound, which is not a missing object.
		case accessCodes[resp.Code] || resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized:
			return fmt.Errorf("%w: %s (check the worker's S3 credentials and policy)", storage.ErrAccess, msg)
		case resp.Code == "NoSuchKey" || resp.Code == "NoSuchBucket" || resp.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%w: %s", storage.ErrNotFound, msg)
		case resp.Code == "PreconditionFailed" || resp.StatusCode == http.StatusPreconditionFailed:
			return fmt.Errorf("%w: %s", storage.ErrChanged, msg)
		case resp.Code == "InvalidRange" || resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
			return fmt.Errorf("%w: %s", storage.ErrShortRead, msg)
		// 501 (a header or operation the server does not implement) and
		// 505 answer the request, not the server's state: the same request
		// cannot succeed, so they are not an outage to wait out.
		case resp.StatusCode == http.StatusNotImplemented || resp.StatusCode == http.StatusHTTPVersionNotSupported:
			return fmt.Errorf("%w: %s (HTTP %d)", storage.ErrRejected, msg, resp.StatusCode)
		case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests ||
			resp.Code == "SlowDown" || resp.Code == "RequestTimeout" || resp.Code == "InternalError":
			return &transient{fmt.Errorf("%w: %s (HTTP %d)", storage.ErrUnavailable, msg, resp.StatusCode)}
		case resp.StatusCode >= 400:
			return fmt.Errorf("%w: %s (HTTP %d)", storage.ErrRejected, msg, resp.StatusCode)
		}
	}
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.As(err, &ne) && ne.Timeout():
		return &transient{fmt.Errorf("%w: %v", storage.ErrUnavailable, err)}
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return &transient{fmt.Errorf("%w: %v", storage.ErrUnavailable, err)}
	}
	// minio-go's own test for a dead connection: it replaces an EOF on a
	// request (a server that died mid-upload) by a plain "Connection closed
	// by foreign host ... Retry again." error that no longer wraps io.EOF.
	if minio.IsNetworkOrHostDown(err, false) {
		return &transient{fmt.Errorf("%w: %v", storage.ErrUnavailable, err)}
	}
	return err
}

// retry runs op under the store's backoff and says how many attempts a
// transient failure survived.
func (s *Store) retry(ctx context.Context, op func(ctx context.Context) error) error {
	err := storage.Retry(ctx, s.backoff, retryable, op)
	if retryable(err) {
		return fmt.Errorf("%w (gave up after %d attempts against %s)", err, s.backoff.Attempts, s.host)
	}
	return err
}

// Stat returns the object's size and ETag.
func (s *Store) Stat(ctx context.Context, ref storage.Ref) (storage.ObjectInfo, error) {
	var info storage.ObjectInfo
	err := s.retry(ctx, func(ctx context.Context) error {
		err := errFallback
		if s.fast != nil {
			info, err = s.fastStat(ctx, ref)
		}
		if err == errFallback {
			var oi minio.ObjectInfo
			oi, err = s.rcore.StatObject(ctx, ref.Bucket, ref.Key, minio.StatObjectOptions{})
			err = classify(err)
			info = storage.ObjectInfo{Size: oi.Size, ETag: oi.ETag}
		}
		if errors.Is(err, storage.ErrNotFound) {
			err = s.whyNotFound(ctx, ref, err)
		}
		return err
	})
	return info, err
}

// fastStat is one Stat attempt on the fast path: a HEAD.
func (s *Store) fastStat(ctx context.Context, ref storage.Ref) (storage.ObjectInfo, error) {
	c, err := s.fast.open(ctx, http.MethodHead, ref.Bucket, ref.Key, 0, -1, "")
	if err != nil {
		if err == errFallback {
			return storage.ObjectInfo{}, err
		}
		return storage.ObjectInfo{}, s.fastErr(ctx, err, "HEAD")
	}
	info := storage.ObjectInfo{Size: c.clen, ETag: c.etagString()}
	s.fast.release(c, true)
	return info, nil
}

// whyNotFound explains a HEAD answered 404. A HEAD response has no body,
// so a missing key, a missing bucket and (on versitygw) an unknown access
// key all look alike; a one-byte GET returns the server's error code.
func (s *Store) whyNotFound(ctx context.Context, ref storage.Ref, headErr error) error {
	var opts minio.GetObjectOptions
	_ = opts.SetRange(0, 0)
	body, _, _, err := s.rcore.GetObject(ctx, ref.Bucket, ref.Key, opts)
	if err == nil {
		body.Close()
		return headErr // it exists now: report what HEAD saw; a retry of the job will find it
	}
	if c := classify(err); errors.Is(c, storage.ErrNotFound) || errors.Is(c, storage.ErrAccess) {
		return c
	}
	return headErr
}

// ReadPrefix reads the object's first len(p) bytes (fewer when it is
// shorter) with one range GET, and takes the object's size from the
// Content-Range header and its version from the ETag: Router.Head needs no
// HEAD request, and a small object's tensors arrive with its header.
func (s *Store) ReadPrefix(ctx context.Context, ref storage.Ref, p []byte) (int, storage.ObjectInfo, error) {
	var n int
	var info storage.ObjectInfo
	err := s.retry(ctx, func(ctx context.Context) error {
		var err error
		if s.fast != nil {
			if n, info, err = s.fastPrefix(ctx, ref, p); err != errFallback {
				return err
			}
		}
		n, info, err = s.minioPrefix(ctx, ref, p)
		return err
	})
	return n, info, err
}

// The minio-go attempts and the HEAD of an empty object are methods of
// their own, kept out of line: their locals (minio.ObjectInfo, the
// options) take kilobytes of stack, and ReadPrefix's and read's attempts
// and the fast path start on goroutines with fresh stacks (the queue's,
// the handler's), where frames that large cost a stack copy
// (runtime.morestack) per job.

// minioPrefix is one ReadPrefix attempt through minio-go.
//
//go:noinline
func (s *Store) minioPrefix(ctx context.Context, ref storage.Ref, p []byte) (int, storage.ObjectInfo, error) {
	var opts minio.GetObjectOptions
	if err := opts.SetRange(0, int64(len(p))-1); err != nil {
		return 0, storage.ObjectInfo{}, err
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watchdog := time.AfterFunc(s.stall, func() { cancel(errStalled) })
	defer watchdog.Stop()
	body, oi, hdr, err := s.rcore.GetObject(actx, ref.Bucket, ref.Key, opts)
	if err != nil {
		err = s.attemptErr(ctx, actx, err, "GET")
		if errors.Is(err, storage.ErrShortRead) {
			return s.emptyPrefix(ctx, ref)
		}
		return 0, storage.ObjectInfo{}, err
	}
	defer body.Close()
	total := oi.Size
	if cr := hdr.Get("Content-Range"); cr != "" {
		_, t, ok := strings.Cut(cr, "/")
		if total, err = strconv.ParseInt(t, 10, 64); !ok || err != nil {
			return 0, storage.ObjectInfo{}, storage.Errorf(storage.ErrRejected, "GET of the object's start: malformed Content-Range %q", cr)
		}
	}
	want := min(int64(len(p)), total)
	if oi.Size < want {
		return 0, storage.ObjectInfo{}, storage.Errorf(storage.ErrShortRead, "GET of the object's start returned %d bytes, want %d", oi.Size, want)
	}
	got, err := io.ReadFull(body, p[:want])
	if err != nil {
		c := s.attemptErr(ctx, actx, err, "GET body")
		if retryable(c) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, storage.ObjectInfo{}, &transient{fmt.Errorf("%w: body cut off after %d of %d bytes: %w", storage.ErrShortRead, got, want, c)}
		}
		return 0, storage.ObjectInfo{}, c
	}
	return got, storage.ObjectInfo{Size: total, ETag: oi.ETag}, nil
}

// emptyPrefix answers a ReadPrefix attempt whose range GET got 416, a
// range of an empty object: one HEAD (retried by the caller's loop, not a
// nested one) gives its size and version.
//
//go:noinline
func (s *Store) emptyPrefix(ctx context.Context, ref storage.Ref) (int, storage.ObjectInfo, error) {
	oi, err := s.rcore.StatObject(ctx, ref.Bucket, ref.Key, minio.StatObjectOptions{})
	if err != nil {
		return 0, storage.ObjectInfo{}, classify(err)
	}
	return 0, storage.ObjectInfo{Size: oi.Size, ETag: oi.ETag}, nil
}

var _ storage.PrefixReader = (*Store)(nil)

// errStalled is the cause of an attempt that StallTimeout aborted.
var errStalled = errors.New("stalled")

// maxSkip is the largest object prefix ReadAtSized fetches and discards to
// read a tail with a plain GET instead of a Range GET: a safetensors header
// of a few tensors is a few hundred bytes.
const maxSkip = 64 << 10

// ReadAt range-reads len(p) bytes at off straight into p (no intermediate
// buffer). A body cut short or stalled is resumed from where it stopped,
// pinned to the same version; a range answered with another length than
// asked is an error, never a silently short or shifted p.
func (s *Store) ReadAt(ctx context.Context, ref storage.Ref, etag string, p []byte, off int64) error {
	return s.read(ctx, ref, etag, p, off, -1)
}

// ReadAtSized is ReadAt for a range of an object of objectSize bytes. When
// the range is the object's tail behind at most 64 KiB (the last tensor of
// a safetensors object), it sends a plain GET and drops the prefix, which
// S3 servers answer from their whole-object path: on versitygw that is
// sendfile, about 1 ms faster per request than a Range GET.
func (s *Store) ReadAtSized(ctx context.Context, ref storage.Ref, etag string, p []byte, off, objectSize int64) error {
	return s.read(ctx, ref, etag, p, off, objectSize)
}

var _ storage.SizedReader = (*Store)(nil)

func (s *Store) read(ctx context.Context, ref storage.Ref, etag string, p []byte, off, objectSize int64) error {
	if len(p) == 0 {
		return nil
	}
	whole := objectSize >= 0 && off <= maxSkip && off+int64(len(p)) == objectSize
	done := 0
	pin := etag
	return s.retry(ctx, func(ctx context.Context) error {
		start := off + int64(done)
		want := int64(len(p) - done)
		skip := int64(0)
		plain := whole && done == 0
		if plain {
			skip, want = off, objectSize
		}
		if s.fast != nil {
			to := int64(-1)
			if skip == 0 {
				to = off + int64(len(p)) - 1
			}
			if err := s.fastRead(ctx, ref, &pin, p, &done, start-skip, to, want, skip); err != errFallback {
				return err
			}
		}
		return s.minioRead(ctx, ref, &pin, p, &done, start, want, skip, plain)
	})
}

// minioRead is one attempt of read through minio-go: a GET from start
// (a plain GET when plain, whose first skip bytes are dropped) whose body
// must be want bytes, into p from *done on, pinned to *pin when set.
//
//go:noinline
func (s *Store) minioRead(ctx context.Context, ref storage.Ref, pin *string, p []byte, done *int, start, want, skip int64, plain bool) error {
	var opts minio.GetObjectOptions
	if !plain {
		if err := opts.SetRange(start, start+int64(len(p)-*done)-1); err != nil {
			return err
		}
	}
	if *pin != "" {
		if err := opts.SetMatchETag(*pin); err != nil {
			return err
		}
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watchdog := time.AfterFunc(s.stall, func() { cancel(errStalled) })
	defer watchdog.Stop()
	body, oi, _, err := s.rcore.GetObject(actx, ref.Bucket, ref.Key, opts)
	if err != nil {
		return s.attemptErr(ctx, actx, err, "GET")
	}
	defer body.Close()
	if *pin == "" {
		*pin = oi.ETag // a resumed read must continue the same version
	}
	switch {
	case oi.Size < want:
		return storage.Errorf(storage.ErrShortRead, "GET at offset %d returned %d bytes, want %d: the object is shorter than its header says", start-skip, oi.Size, want)
	case oi.Size > want:
		return storage.Errorf(storage.ErrRejected, "GET at offset %d returned %d bytes, want %d: the server ignored the Range header", start-skip, oi.Size, want)
	}
	if skip > 0 {
		if _, err := io.CopyN(io.Discard, body, skip); err != nil {
			c := s.attemptErr(ctx, actx, err, "GET body")
			if retryable(c) {
				return &transient{fmt.Errorf("%w: body cut off in the %d-byte prefix: %w", storage.ErrShortRead, skip, c)}
			}
			return c
		}
	}
	for *done < len(p) {
		n, err := body.Read(p[*done:])
		*done += n
		if n > 0 {
			watchdog.Reset(s.stall)
		}
		if err == io.EOF && *done < len(p) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil && *done < len(p) {
			c := s.attemptErr(ctx, actx, err, "GET body")
			if retryable(c) {
				return &transient{fmt.Errorf("%w: body cut off after %d of %d bytes: %w", storage.ErrShortRead, *done, len(p), c)}
			}
			return c
		}
	}
	return nil
}

// fastPrefix is one ReadPrefix attempt on the fast path.
func (s *Store) fastPrefix(ctx context.Context, ref storage.Ref, p []byte) (int, storage.ObjectInfo, error) {
	c, err := s.fast.open(ctx, http.MethodGet, ref.Bucket, ref.Key, 0, int64(len(p))-1, "")
	if err != nil {
		if err == errFallback {
			return 0, storage.ObjectInfo{}, err
		}
		err = s.fastErr(ctx, err, "GET")
		if errors.Is(err, storage.ErrShortRead) {
			return s.emptyPrefix(ctx, ref)
		}
		return 0, storage.ObjectInfo{}, err
	}
	ok := false
	defer func() { s.fast.release(c, ok) }()
	total := c.clen
	if c.badCR {
		return 0, storage.ObjectInfo{}, storage.Errorf(storage.ErrRejected, "GET of the object's start: malformed Content-Range")
	} else if c.total >= 0 {
		total = c.total
	}
	want := min(int64(len(p)), total)
	if c.clen < want {
		return 0, storage.ObjectInfo{}, storage.Errorf(storage.ErrShortRead, "GET of the object's start returned %d bytes, want %d", c.clen, want)
	}
	got, err := s.fast.read(ctx, c, p[:want])
	if err != nil {
		e := s.fastErr(ctx, err, "GET body")
		if retryable(e) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, storage.ObjectInfo{}, &transient{fmt.Errorf("%w: body cut off after %d of %d bytes: %w", storage.ErrShortRead, got, want, e)}
		}
		return 0, storage.ObjectInfo{}, e
	}
	ok = true
	return got, storage.ObjectInfo{Size: total, ETag: c.etagString()}, nil
}

// fastRead is one attempt of read on the fast path: a GET from start (to
// to, or a plain GET when to < 0) whose first skip bytes are dropped and
// whose body must be want bytes, into p from *done on. *pin is set from the
// first answer so that a resumed read continues the same version.
func (s *Store) fastRead(ctx context.Context, ref storage.Ref, pin *string, p []byte, done *int, start, to, want, skip int64) error {
	c, err := s.fast.open(ctx, http.MethodGet, ref.Bucket, ref.Key, start, to, *pin)
	if err != nil {
		if err == errFallback {
			return err
		}
		return s.fastErr(ctx, err, "GET")
	}
	ok := false
	defer func() { s.fast.release(c, ok) }()
	if *pin == "" {
		*pin = c.etagString()
	}
	switch {
	case c.clen < want:
		return storage.Errorf(storage.ErrShortRead, "GET at offset %d returned %d bytes, want %d: the object is shorter than its header says", start, c.clen, want)
	case c.clen > want:
		return storage.Errorf(storage.ErrRejected, "GET at offset %d returned %d bytes, want %d: the server ignored the Range header", start, c.clen, want)
	}
	if skip > 0 {
		if err := s.fast.discard(ctx, c, skip); err != nil {
			e := s.fastErr(ctx, err, "GET body")
			if retryable(e) {
				return &transient{fmt.Errorf("%w: body cut off in the %d-byte prefix: %w", storage.ErrShortRead, skip, e)}
			}
			return e
		}
	}
	n, err := s.fast.read(ctx, c, p[*done:])
	*done += n
	if err != nil {
		e := s.fastErr(ctx, err, "GET body")
		if retryable(e) {
			return &transient{fmt.Errorf("%w: body cut off after %d of %d bytes: %w", storage.ErrShortRead, *done, len(p), e)}
		}
		return e
	}
	ok = true
	return nil
}

// fastErr classifies a fast-path error as attemptErr does a minio-go one:
// the caller's cancellation as is, a deadline that the stall timeout set
// as a transient stall.
func (s *Store) fastErr(ctx context.Context, err error, what string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			return context.DeadlineExceeded
		}
		return &transient{fmt.Errorf("%w: %s: no bytes for %v", storage.ErrUnavailable, what, s.stall)}
	}
	return classify(err)
}

// attemptErr classifies the error of one attempt run under actx, a child
// of ctx that the stall watchdog may cancel: a stall is transient, the
// caller's own cancellation is returned as is.
func (s *Store) attemptErr(ctx, actx context.Context, err error, what string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(context.Cause(actx), errStalled) {
		return &transient{fmt.Errorf("%w: %s: no bytes for %v", storage.ErrUnavailable, what, s.stall)}
	}
	return classify(err)
}

// minPart is the smallest part S3 accepts for any but the last part of a
// multipart upload.
const minPart = 5 << 20

// uploadThreads is how many parts go up at once (minio-go's default).
const uploadThreads = 4

// maxPut is the largest single PUT, and part, S3 accepts.
const maxPut = 5 << 30

// DefaultMultipartThreshold is Config.MultipartThreshold's default.
const DefaultMultipartThreshold = 128 << 20

// DefaultPartSize is Config.PartSize's default (minio-go's).
const DefaultPartSize = 16 << 20

// partPlan returns the part boundaries of an object of size bytes, or nil
// for one PUT: objects up to the multipart threshold (and any of at most
// 5 MiB, the smallest part). Above it, size / PartSize parts rounded down
// (an output of 64 MiB of tensor plus a few hundred bytes of header is 4
// parts, not 4 full parts and a fifth for the header's worth). The first
// part, which holds the header, is the S3 minimum of 5 MiB and the others
// share the rest equally: Write finishes the header (its tensors' sha256s)
// while parts 2..N go up, and only 5 MiB wait for it. An object under two
// part sizes is 2 parts. Beyond 10,000 parts, nil.
func (s *Store) partPlan(size int64) []int64 {
	base := int64(s.part)
	if base <= 0 {
		base = DefaultPartSize
	}
	thr := int64(s.threshold)
	if thr <= 0 {
		thr = DefaultMultipartThreshold
	}
	n := size / base
	if size <= thr || size <= minPart || n > 10000 {
		return nil
	}
	n = max(n, 2) // above PartSize, below twice it: 5 MiB and the rest
	first := int64(minPart)
	if base <= minPart {
		first = max((size+n-1)/n, minPart) // equal parts
	}
	rest := (size - first + n - 2) / (n - 1) // >= base >= 5 MiB
	bounds := make([]int64, n+1)
	bounds[1] = first
	for i := 2; i < int(n); i++ {
		bounds[i] = bounds[i-1] + rest
	}
	bounds[n] = size
	return bounds
}

// Put uploads size bytes from r: one PUT up to the part size, a multipart
// upload above it (from an io.ReaderAt and io.Seeker such as
// storage.Segments; other bodies go through minio-go's own multipart
// upload). A failed attempt is retried from the start: the body is
// rewound, a multipart upload is aborted and started again. A body that
// can't be rewound gets a single attempt.
func (s *Store) Put(ctx context.Context, ref storage.Ref, r io.Reader, size int64) error {
	seeker, canRewind := r.(io.Seeker)
	var start int64
	if canRewind {
		var err error
		if start, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			canRewind = false
		}
	}
	ra, isReaderAt := r.(io.ReaderAt)
	bounds := s.partPlan(size)
	attempt := 0
	b := s.backoff
	if !canRewind {
		b.Attempts = 1
	}
	err := storage.Retry(ctx, b, retryable, func(ctx context.Context) error {
		if canRewind && isReaderAt && bounds != nil {
			attempt++
			return s.putMultipart(ctx, ref, r, start, io.NewSectionReader(ra, start, size), bounds)
		}
		if attempt++; attempt > 1 {
			if _, err := seeker.Seek(start, io.SeekStart); err != nil {
				return fmt.Errorf("rewind body for retry: %w", err)
			}
		}
		var part uint64
		if bounds != nil {
			n := int64(len(bounds) - 1)
			part = uint64((size + n - 1) / n) // minio-go: equal parts, the last shorter
		}
		var crc string
		if bounds == nil && isReaderAt && canRewind {
			// An unsigned single PUT whose sender dies mid-body can leave
			// the truncated body behind as the object (versitygw v1.8.0
			// does: faults TestKillMidBatch). A CRC32C of the whole body in
			// a header makes the server refuse a body that does not match,
			// so a reader never sees half an output. CRC32C runs at memory
			// speed (SSE4.2): a body up to 1 MiB in one pass (Write has
			// finished its header), a larger one all but its first 4 KiB
			// while Write still hashes the tensors (checksum.go).
			var sum uint32
			var err error
			if wt, ok := r.(seekWriterTo); ok {
				sum, err = crc32cTo(wt, ra, start, size)
			} else {
				sum, err = crc32cAt(ra, start, size)
			}
			if err != nil {
				return fmt.Errorf("checksum body: %w", err)
			}
			crc = crc32cHeader(sum)
			if wt, ok := r.(seekWriterTo); ok && s.fast != nil && !s.sign {
				if err := s.fast.put(ctx, ref, wt, start, size, crc); err != errFallback {
					return s.fastErr(ctx, err, "PUT")
				}
				if _, err := seeker.Seek(start, io.SeekStart); err != nil {
					return fmt.Errorf("rewind body: %w", err)
				}
			}
		}
		return s.minioPut(ctx, ref, r, size, part, crc)
	})
	if retryable(err) {
		return fmt.Errorf("%w (gave up after %d attempts against %s)", err, attempt, s.host)
	}
	return err
}

// minioPut is one attempt of Put through minio-go: a single PUT (with
// the body's CRC32C when crc is set), or minio-go's multipart upload in
// parts of part bytes. Kept out of line for the stack's sake, as
// minioPrefix is: minio.PutObjectOptions is large.
//
//go:noinline
func (s *Store) minioPut(ctx context.Context, ref storage.Ref, r io.Reader, size int64, part uint64, crc string) error {
	opts := minio.PutObjectOptions{
		ContentType:          "application/octet-stream",
		PartSize:             part,
		DisableContentSha256: !s.sign,
	}
	if crc != "" {
		opts.UserMetadata = map[string]string{"x-amz-checksum-crc32c": crc}
	}
	_, err := s.core.Client.PutObject(ctx, ref.Bucket, ref.Key, r, size, opts)
	return classify(err)
}

// putMultipart is one attempt at a multipart upload of body split at
// bounds: parts 2..N first, uploadThreads at a time, then part 1 (the
// bytes a Write body releases last), then the completion that makes the
// object visible at once. A failed attempt aborts its upload.
func (s *Store) putMultipart(ctx context.Context, ref storage.Ref, r io.Reader, start int64, body *io.SectionReader, bounds []int64) (err error) {
	// Checksums as minio-go's own multipart upload sends them, a CRC32C of
	// each part and their composite at completion, but each part's in a
	// header (checksum.go): the part goes up plain, not aws-chunked.
	id, err := s.core.NewMultipartUpload(ctx, ref.Bucket, ref.Key, minio.PutObjectOptions{ContentType: "application/octet-stream",
		UserMetadata: map[string]string{"x-amz-checksum-algorithm": minio.ChecksumCRC32C.String()}})
	if err != nil {
		return classify(err)
	}
	defer func() {
		if err != nil {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_ = s.core.AbortMultipartUpload(actx, ref.Bucket, ref.Key, id) // best effort: the error that matters is err
		}
	}()
	n := len(bounds) - 1
	// Parts 2..N are summed in one pass straight from the body's buffers
	// when it can write itself out (storage.Segments), as they go up;
	// part 1, which holds the header, is summed by its uploader.
	wt, _ := r.(seekWriterTo)
	var sums *rangeCRC
	if wt != nil && n > 1 {
		sums = &rangeCRC{bounds: make([]int64, n), at: start + bounds[1], sums: make([]uint32, n-1), ready: make([]chan struct{}, n-1)}
		for i := range sums.ready {
			sums.ready[i] = make(chan struct{})
		}
		for i := range sums.bounds {
			sums.bounds[i] = start + bounds[i+1]
		}
	}
	parts := make([]minio.ObjectPart, n)
	order := make(chan int, n)
	for i := 1; i < n; i++ {
		order <- i
	}
	order <- 0
	close(order)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if sums != nil {
		passDone := make(chan error, 1)
		go func() {
			perr := sums.run(wt, start)
			if perr != nil {
				cancel() // parts waiting for a sum give up
			}
			passDone <- perr
		}()
		defer func() {
			if perr := <-passDone; perr != nil {
				err = fmt.Errorf("checksum parts: %w", perr)
			}
		}()
	}
	errs := make(chan error, uploadThreads)
	for range min(uploadThreads, n) {
		go func() {
			for i := range order {
				if pctx.Err() != nil {
					break
				}
				off, end := bounds[i], bounds[i+1]
				var sum uint32
				var err error
				if sums != nil && i > 0 {
					select {
					case <-sums.ready[i-1]:
						sum = sums.sums[i-1]
					case <-pctx.Done():
						err = pctx.Err()
					}
				} else {
					sum, err = crc32cAt(body, off, end-off)
				}
				if err != nil {
					cancel()
					errs <- fmt.Errorf("part %d of %d (bytes %d-%d): checksum: %w", i+1, n, off, end-1, err)
					return
				}
				crc := crc32cHeader(sum)
				hdr := http.Header{minio.ChecksumCRC32C.Key(): []string{crc}}
				p, err := s.core.PutObjectPart(pctx, ref.Bucket, ref.Key, id, i+1, io.NewSectionReader(body, off, end-off), end-off,
					minio.PutObjectPartOptions{DisableContentSha256: !s.sign, CustomHeader: hdr})
				if err == nil && p.ChecksumCRC32C == "" {
					p.ChecksumCRC32C = crc // the server checked it; not every server echoes it
				}
				if err != nil {
					cancel()
					errs <- fmt.Errorf("part %d of %d (bytes %d-%d): %w", i+1, n, off, end-1, uploadErr(err))
					return
				}
				parts[i] = p
			}
			errs <- nil
		}()
	}
	for range min(uploadThreads, n) {
		if e := <-errs; e != nil && (err == nil || errors.Is(err, context.Canceled)) {
			err = e // the first real failure, not a sibling it cancelled
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	complete := make([]minio.CompletePart, n)
	for i, p := range parts {
		complete[i] = minio.CompletePart{PartNumber: i + 1, ETag: p.ETag, ChecksumCRC32C: p.ChecksumCRC32C}
	}
	copts := minio.PutObjectOptions{ContentType: "application/octet-stream"}
	if sum, err := minio.ChecksumCRC32C.CompositeChecksum(parts); err == nil {
		copts.UserMetadata = map[string]string{minio.ChecksumCRC32C.Key(): sum.Encoded(), "x-amz-checksum-type": minio.ChecksumCompositeMode.String()}
	}
	// The uploads of this key in progress, ours among them: those that
	// began before ours are aborted once ours completes (uploads.go).
	ups, lerr := s.keyUploads(ctx, ref.Bucket, ref.Key)
	if _, err := s.core.CompleteMultipartUpload(ctx, ref.Bucket, ref.Key, id, complete, copts); err != nil {
		return uploadErr(err)
	}
	if lerr == nil {
		s.abortOlder(context.WithoutCancel(ctx), ref.Bucket, ref.Key, id, ups)
	}
	return nil
}
