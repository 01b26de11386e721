// Package storage names tensors by URI, routes each URI to the Store of its
// scheme, enforces the allow-list, and moves tensor bytes between stores and
// caller-owned buffers (the compute backend's memory) without intermediate
// copies. The tensor format is safetensors (see storage/safetensors).
//
// Concrete stores live in their own packages, named after what they wrap:
// storage/file (local disk) and storage/s3 (minio-go). The worker wires them
// into a Router.
package storage

import (
	"context"
	"errors"
	"io"
)

// Sentinel errors. Errors returned by this package wrap one of them (inside
// an *Error that names the operation, URI and tensor), so callers classify
// with errors.Is. Permanent returns true for the ones a retry cannot fix.
var (
	ErrNotFound   = errors.New("not found")           // object, bucket or tensor name missing
	ErrNotAllowed = errors.New("not allowed")         // outside the allow-list, .., symlink escape
	ErrInvalidURI = errors.New("invalid tensor URI")  // malformed URI
	ErrFormat     = errors.New("invalid safetensors") // malformed header, sizes inconsistent
	ErrDType      = errors.New("unsupported dtype")   // a dtype we do not compute
	ErrTooLarge   = errors.New("too large")           // over a configured limit
	ErrAccess     = errors.New("access denied")       // credentials rejected
	ErrShortRead  = errors.New("short read")          // object ended early (transient)
)

// Permanent reports whether err is one a retry cannot fix.
func Permanent(err error) bool {
	for _, e := range []error{ErrNotFound, ErrNotAllowed, ErrInvalidURI, ErrFormat, ErrDType, ErrTooLarge, ErrAccess} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Ref is a parsed tensor URI: s3://bucket/key#name or file:///abs/path#name.
type Ref struct {
	Scheme string // "s3" or "file"
	Bucket string // s3 only
	Key    string // object key (s3) or absolute path (file)
	Name   string // tensor name inside the safetensors file; "" = the only one
}

// String returns the URI form of r.
func (r Ref) String() string {
	s := r.Scheme + "://" + r.Bucket + "/" + trimSlash(r.Key)
	if r.Scheme == "file" {
		s = "file://" + r.Key
	}
	if r.Name != "" {
		s += "#" + r.Name
	}
	return s
}

func trimSlash(s string) string {
	for len(s) > 0 && s[0] == '/' {
		s = s[1:]
	}
	return s
}

// Store is one object store. Implementations retry transient failures
// themselves, honour ctx, and return errors wrapping the sentinels above.
type Store interface {
	// Size returns the object's size in bytes.
	Size(ctx context.Context, bucket, key string) (int64, error)
	// ReadAt fills p exactly with the object's bytes starting at off; a
	// shorter object is ErrShortRead, never a silently short p.
	ReadAt(ctx context.Context, bucket, key string, p []byte, off int64) error
	// Put writes the object atomically from r, which yields exactly size
	// bytes: a reader sees the old object or the whole new one.
	Put(ctx context.Context, bucket, key string, r io.Reader, size int64) error
}
