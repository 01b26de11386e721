package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
)

// Presigner signs S3 URLs: the caller moves the bytes with the URL, and
// the gateway's credentials never leave it.
type Presigner interface {
	PresignPut(ctx context.Context, bucket, key string, expiry time.Duration) (*url.URL, error)
	PresignGet(ctx context.Context, bucket, key string, expiry time.Duration) (*url.URL, error)
}

// NewS3Presigner signs with a minio-go client, whose endpoint is the one
// the URLs name: the endpoint as the callers reach it.
func NewS3Presigner(c *minio.Client) Presigner { return minioPresigner{c} }

type minioPresigner struct{ c *minio.Client }

func (p minioPresigner) PresignPut(ctx context.Context, bucket, key string, expiry time.Duration) (*url.URL, error) {
	return p.c.PresignedPutObject(ctx, bucket, key, expiry)
}

func (p minioPresigner) PresignGet(ctx context.Context, bucket, key string, expiry time.Duration) (*url.URL, error) {
	return p.c.PresignedGetObject(ctx, bucket, key, expiry, nil)
}

// FileObjects is the file store behind /v1/files: the zero-setup mode,
// where the gateway itself takes uploads (size-limited) and serves
// outputs, through URLs it signs like presigned S3 URLs.
type FileObjects struct {
	Store *file.Store
	// Key signs the URLs (HMAC-SHA256); every gateway that should accept
	// another's URLs needs the same key.
	Key []byte
	// MaxBytes bounds one upload; default 64 MiB.
	MaxBytes int64
}

// NewURLKey returns a random key for FileObjects.Key.
func NewURLKey() ([]byte, error) {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("url key: %w", err)
	}
	return k, nil
}

// signedURL is one upload or download URL.
type signedURL struct {
	URI       string    `json:"uri"`
	Out       string    `json:"out,omitempty"`
	Method    string    `json:"method"`
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// objectsRequest is the body of POST /v1/uploads (uris or count) and
// POST /v1/downloads (uris).
type objectsRequest struct {
	URIs  []string `json:"uris"`
	Count int      `json:"count"`
}

// uploads is POST /v1/uploads: a PUT URL for each object URI given (each
// must be writable under the allow-list), or for count new objects under
// the upload prefix, each with an out URI beside it for its job's output.
func (s *Server) uploads(w http.ResponseWriter, r *http.Request) *apiError {
	req, e := s.objectsRequest(w, r, true)
	if e != nil {
		return e
	}
	uris, outs := req.URIs, []string(nil)
	if req.Count > 0 {
		if s.cfg.UploadPrefix == "" {
			return newErr(http.StatusBadRequest, CodeInvalidRequest, "count: this gateway has no upload prefix (uploads.prefix): name the objects with uris")
		}
		for range req.Count {
			var b [12]byte
			_, _ = rand.Read(b[:])
			dir := s.cfg.UploadPrefix + hex.EncodeToString(b[:]) + "/"
			uris = append(uris, dir+"in.safetensors")
			outs = append(outs, dir+"out.safetensors")
		}
	}
	out, e := s.sign(r, uris, http.MethodPut)
	if e != nil {
		return e
	}
	for i := range outs {
		out[i].Out = outs[i]
	}
	writeJSON(w, http.StatusOK, struct {
		Uploads []signedURL `json:"uploads"`
	}{out})
	return nil
}

// downloads is POST /v1/downloads: a GET URL for each object URI given
// (each must be readable under the allow-list).
func (s *Server) downloads(w http.ResponseWriter, r *http.Request) *apiError {
	req, e := s.objectsRequest(w, r, false)
	if e != nil {
		return e
	}
	out, e := s.sign(r, req.URIs, http.MethodGet)
	if e != nil {
		return e
	}
	writeJSON(w, http.StatusOK, struct {
		Downloads []signedURL `json:"downloads"`
	}{out})
	return nil
}

func (s *Server) objectsRequest(w http.ResponseWriter, r *http.Request, countOK bool) (objectsRequest, *apiError) {
	var req objectsRequest
	body, e := s.readBody(w, r, s.cfg.MaxBodyBytes)
	if e != nil {
		return req, e
	}
	if e := decodeStrict(body, &req); e != nil {
		return req, e
	}
	n := len(req.URIs)
	switch {
	case !countOK && req.Count != 0:
		return req, newErr(http.StatusBadRequest, CodeInvalidRequest, "count: downloads take uris only")
	case req.Count < 0:
		return req, newErr(http.StatusBadRequest, CodeInvalidRequest, "count: must be > 0, got %d", req.Count)
	case req.Count > 0 && n > 0:
		return req, newErr(http.StatusBadRequest, CodeInvalidRequest, "give uris or count, not both")
	case req.Count == 0 && n == 0:
		if countOK {
			return req, newErr(http.StatusBadRequest, CodeInvalidRequest, "give uris (objects to write) or count (new objects under the upload prefix)")
		}
		return req, newErr(http.StatusBadRequest, CodeInvalidRequest, "uris: no object URIs given")
	}
	if n+req.Count > s.cfg.MaxBatch {
		return req, newErr(http.StatusRequestEntityTooLarge, CodeTooLarge, "%d objects, limit %d (limits.max_batch)", n+req.Count, s.cfg.MaxBatch)
	}
	return req, nil
}

// sign checks each URI against the allow-list for method (PUT writes, GET
// reads) and signs a URL for it.
func (s *Server) sign(r *http.Request, uris []string, method string) ([]signedURL, *apiError) {
	exp := time.Now().Add(s.cfg.URLExpiry).Truncate(time.Second)
	out := make([]signedURL, len(uris))
	for i, uri := range uris {
		ref, e := s.checkObject(uri, method == http.MethodPut)
		if e != nil {
			return nil, e
		}
		var u string
		switch ref.Scheme {
		case "s3":
			if s.cfg.Presigner == nil {
				return nil, &apiError{Status: http.StatusForbidden, Code: CodeNotAllowed, URI: uri, Message: "this gateway signs no s3:// URLs (storage.s3 is not configured)"}
			}
			sign := s.cfg.Presigner.PresignGet
			if method == http.MethodPut {
				sign = s.cfg.Presigner.PresignPut
			}
			pu, err := sign(r.Context(), ref.Bucket, ref.Key, s.cfg.URLExpiry)
			if err != nil {
				return nil, &apiError{Status: http.StatusInternalServerError, Code: CodeInternal, URI: uri, Message: fmt.Sprintf("presigning %s %s: %v", method, uri, err)}
			}
			u = pu.String()
		case "file":
			rel, ok := s.fileRel(ref)
			if !ok {
				return nil, &apiError{Status: http.StatusForbidden, Code: CodeNotAllowed, URI: uri, Message: "this gateway serves no file:// objects outside its file store root"}
			}
			u = s.baseURL(r) + "/v1/files/" + escapePath(rel) + "?" + fileQuery(s.cfg.Files.Key, method, rel, exp)
		}
		s.metrics.urls.WithLabelValues(method, ref.Scheme).Inc()
		out[i] = signedURL{URI: uri, Method: method, URL: u, ExpiresAt: exp.UTC()}
	}
	return out, nil
}

// checkObject parses an object URI (no #name) and applies the allow-list.
func (s *Server) checkObject(uri string, write bool) (storage.Ref, *apiError) {
	ref, err := storage.ParseRef(uri)
	if err != nil {
		return ref, &apiError{Status: http.StatusBadRequest, Code: CodeInvalidRequest, URI: uri, Message: err.Error()}
	}
	if ref.Name != "" {
		return ref, &apiError{Status: http.StatusBadRequest, Code: CodeInvalidRequest, URI: uri,
			Message: fmt.Sprintf("%s names a tensor (#%s): uploads and downloads are of whole objects", uri, ref.Name)}
	}
	err = errNoStore
	if s.cfg.Store != nil {
		err = s.cfg.Store.Check(uri, write)
	}
	if err != nil {
		return ref, &apiError{Status: http.StatusForbidden, Code: CodeNotAllowed, URI: uri, Message: err.Error()}
	}
	return ref, nil
}

var errNoStore = errors.New("this gateway has no store configured (storage.file_root, storage.s3): it signs no URLs")

// checkWritable applies cfg's allow-list to uri for writing.
func checkWritable(cfg Config, uri string) error {
	if cfg.Store == nil {
		return errNoStore
	}
	return cfg.Store.Check(uri, true)
}

// fileRel is ref's path relative to the file store root.
func (s *Server) fileRel(ref storage.Ref) (string, bool) {
	if s.cfg.Files == nil {
		return "", false
	}
	rel, ok := strings.CutPrefix(ref.Key, strings.TrimSuffix(s.cfg.Files.Store.Root(), "/")+"/")
	return rel, ok && rel != ""
}

// baseURL is this gateway as the caller reached it, or Config.PublicURL.
func (s *Server) baseURL(r *http.Request) string {
	if s.cfg.PublicURL != "" {
		return strings.TrimSuffix(s.cfg.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func escapePath(rel string) string {
	segs := strings.Split(rel, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

// fileQuery is a file URL's query: its expiry (Unix seconds) and the
// HMAC-SHA256 of method, path and expiry.
func fileQuery(key []byte, method, rel string, exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	return "expires=" + e + "&sig=" + fileSig(key, method, rel, e)
}

func fileSig(key []byte, method, rel, expires string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(method + "\n" + rel + "\n" + expires))
	return hex.EncodeToString(m.Sum(nil))
}

// fileRef checks a /v1/files request's signature and expiry and returns
// the object it names.
func (s *Server) fileRef(r *http.Request, write bool) (storage.Ref, string, *apiError) {
	if s.cfg.Files == nil {
		return storage.Ref{}, "", newErr(http.StatusNotFound, CodeNotFound, "this gateway serves no file store objects (storage.file_root is not set)")
	}
	rel := r.PathValue("path")
	q := r.URL.Query()
	exp, sig := q.Get("expires"), q.Get("sig")
	want := fileSig(s.cfg.Files.Key, r.Method, rel, exp)
	if exp == "" || sig == "" || !hmac.Equal([]byte(sig), []byte(want)) {
		return storage.Ref{}, "", newErr(http.StatusForbidden, CodeBadSignature, "%s /v1/files/%s: the URL's signature does not match (altered, for another method, or signed by a gateway with another uploads.url_key): ask /v1/uploads or /v1/downloads for a URL", r.Method, rel)
	}
	e, err := strconv.ParseInt(exp, 10, 64)
	if err != nil {
		return storage.Ref{}, "", newErr(http.StatusForbidden, CodeBadSignature, "expires %q is not a Unix time", exp)
	}
	if t := time.Unix(e, 0); time.Now().After(t) {
		return storage.Ref{}, "", newErr(http.StatusForbidden, CodeURLExpired, "%s /v1/files/%s: the URL expired at %s (URLs are valid for %v): ask for a new one",
			r.Method, rel, t.UTC().Format(time.RFC3339), s.cfg.URLExpiry)
	}
	uri := "file://" + strings.TrimSuffix(s.cfg.Files.Store.Root(), "/") + "/" + rel
	ref, err := storage.ParseRef(uri)
	if err == nil {
		err = s.cfg.Files.Store.Check(ref, write)
	}
	if err != nil {
		return storage.Ref{}, "", &apiError{Status: http.StatusForbidden, Code: CodeNotAllowed, URI: uri, Message: err.Error()}
	}
	return ref, uri, nil
}

// putFile is PUT /v1/files/{path}: an upload into the file store, at most
// FileObjects.MaxBytes, with its Content-Length. The object appears whole
// or not at all (the store writes a temporary file and renames it).
func (s *Server) putFile(w http.ResponseWriter, r *http.Request) *apiError {
	ref, uri, e := s.fileRef(r, true)
	if e != nil {
		return e
	}
	limit := s.cfg.Files.MaxBytes
	if limit <= 0 {
		limit = 64 << 20
	}
	if r.ContentLength < 0 {
		return newErr(http.StatusLengthRequired, CodeLengthRequired, "PUT %s: send Content-Length (uploads are not chunked)", uri)
	}
	if r.ContentLength > limit {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge, URI: uri,
			Message: fmt.Sprintf("upload of %d bytes to %s, limit %d (uploads.max_bytes)", r.ContentLength, uri, limit)}
	}
	if err := s.cfg.Files.Store.Put(r.Context(), ref, http.MaxBytesReader(w, r.Body, limit), r.ContentLength); err != nil {
		return &apiError{Status: http.StatusBadRequest, Code: CodeInvalidRequest, URI: uri, Message: fmt.Sprintf("upload to %s: %v", uri, err)}
	}
	s.metrics.uploadBytes.Add(float64(r.ContentLength))
	writeJSON(w, http.StatusCreated, struct {
		URI   string `json:"uri"`
		Bytes int64  `json:"bytes"`
	}{uri, r.ContentLength})
	return nil
}

// getFile is GET /v1/files/{path}: an object of the file store, pinned to
// the version it had when the request came (a replaced object ends the
// answer early rather than mixing two versions).
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) *apiError {
	ref, uri, e := s.fileRef(r, false)
	if e != nil {
		return e
	}
	info, err := s.cfg.Files.Store.Stat(r.Context(), ref)
	if errors.Is(err, storage.ErrNotFound) {
		return &apiError{Status: http.StatusNotFound, Code: CodeNotFound, URI: uri, Message: err.Error()}
	}
	if err != nil {
		return &apiError{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, URI: uri, Message: err.Error()}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", strconv.Quote(info.ETag))
	http.ServeContent(w, r, "", time.Time{}, io.NewSectionReader(&objectReader{ctx: r.Context(), st: s.cfg.Files.Store, ref: ref, etag: info.ETag}, 0, info.Size))
	return nil
}

// objectReader is a store object as an io.ReaderAt.
type objectReader struct {
	ctx  context.Context
	st   *file.Store
	ref  storage.Ref
	etag string
}

func (o *objectReader) ReadAt(p []byte, off int64) (int, error) {
	if err := o.st.ReadAt(o.ctx, o.ref, o.etag, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}
