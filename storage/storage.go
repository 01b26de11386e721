package storage

import (
	"context"
	"io"
	"strings"
)

// Ref is a parsed tensor URI: s3://bucket/key#name or file:///abs/path#name.
type Ref struct {
	Scheme string // "s3" or "file"
	Bucket string // s3 only
	Key    string // object key (s3, no leading slash) or absolute path (file)
	Name   string // tensor name inside the safetensors file; "" = the only one
}

// String returns the URI form of r. It never holds credentials: those come
// from the store's configuration, never from a URI.
func (r Ref) String() string {
	var s string
	if r.Scheme == "file" {
		s = "file://" + r.Key
	} else {
		s = r.Scheme + "://" + r.Bucket + "/" + r.Key
	}
	if r.Name != "" {
		s += "#" + r.Name
	}
	return s
}

// Object returns r without its tensor name: the object it lives in.
func (r Ref) Object() Ref {
	r.Name = ""
	return r
}

// ObjectInfo is what a Store knows about one stored object.
type ObjectInfo struct {
	Size int64
	// ETag identifies the object's current version ("" when the store has
	// none). Reads pinned to it fail with ErrChanged once it is replaced.
	ETag string
}

// Store is one object store, registered with a Router under a URI scheme.
// Implementations retry transient failures themselves (capped exponential
// backoff with jitter, see Retry), honour ctx, enforce their own allow-list
// and return errors wrapping the sentinels of this package.
type Store interface {
	// Check applies the allow-list and the store's rules on names to ref,
	// for reading or (write) writing. It does no I/O.
	Check(ref Ref, write bool) error
	// Stat returns the object's size and version.
	Stat(ctx context.Context, ref Ref) (ObjectInfo, error)
	// ReadAt fills p exactly with the object's bytes starting at off. When
	// etag is not "", the read is pinned to that version (ErrChanged once
	// the object was replaced). An object that ends early is ErrShortRead,
	// never a silently short p.
	ReadAt(ctx context.Context, ref Ref, etag string, p []byte, off int64) error
	// Put writes the object atomically from r, which must yield exactly
	// size bytes: a reader sees the old object or the whole new one.
	Put(ctx context.Context, ref Ref, r io.Reader, size int64) error
}

// SizedReader is an optional Store method that Router.Fetch uses when a
// store has it: ReadAt, told the object's total size, so the store can pick
// the cheapest request for the range (storage/s3 reads an object's last
// tensor behind a small header with a plain GET instead of a Range GET).
type SizedReader interface {
	ReadAtSized(ctx context.Context, ref Ref, etag string, p []byte, off, objectSize int64) error
}

// PrefixReader is an optional Store method that Router.Head uses when a
// store has it, instead of Stat then ReadAt: ReadPrefix fills p with the
// object's first bytes (all of them when it is shorter) and returns how many,
// with the object's size and version, in one request. For a small object
// that one request also brings the tensor, so Head+Fetch costs one round
// trip instead of three.
type PrefixReader interface {
	ReadPrefix(ctx context.Context, ref Ref, p []byte) (int, ObjectInfo, error)
}

// ParseRef parses a tensor URI: s3://bucket/key#name or
// file:///abs/path#name. The #name fragment is optional. It rejects empty
// parts, "." and ".." segments, empty segments, query strings, user info,
// percent escapes and control characters, all with ErrInvalidURI, so that
// the allow-list sees exactly the path that is opened.
func ParseRef(uri string) (Ref, error) {
	bad := func(why string) (Ref, error) {
		return Ref{}, &Error{Op: "parse", URI: redactURI(uri), Err: errorf(ErrInvalidURI, "%s", why)}
	}
	for _, c := range uri {
		if c < 0x20 || c == 0x7f {
			return bad("control character in URI")
		}
	}
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return bad("want s3://bucket/key or file:///abs/path (an input may add #name to pick one of its tensors; an output may not)")
	}
	rest, name, hasName := strings.Cut(rest, "#")
	if hasName && name == "" {
		return bad("empty tensor name after #")
	}
	if strings.ContainsAny(rest, "?%\\") {
		return bad("query strings, percent escapes and backslashes are not supported in tensor URIs")
	}
	var r Ref
	switch scheme {
	case "s3":
		bucket, key, ok := strings.Cut(rest, "/")
		if bucket == "" || strings.Contains(bucket, "@") || strings.Contains(bucket, ":") {
			return bad("missing or malformed bucket (credentials and endpoints come from configuration, not URIs)")
		}
		if !ok || key == "" {
			return bad("missing object key")
		}
		if err := cleanSegments(key); err != "" {
			return bad(err)
		}
		r = Ref{Scheme: "s3", Bucket: bucket, Key: key, Name: name}
	case "file":
		if !strings.HasPrefix(rest, "/") {
			return bad("file URIs take an absolute path: file:///abs/path (no host)")
		}
		if err := cleanSegments(rest[1:]); err != "" {
			return bad(err)
		}
		r = Ref{Scheme: "file", Key: rest, Name: name}
	default:
		return bad("unknown scheme " + quote(scheme) + " (supported: s3, file)")
	}
	return r, nil
}

// cleanSegments checks a slash-separated path for empty, "." and ".."
// segments; it returns why it is bad, or "".
func cleanSegments(p string) string {
	if p == "" {
		return "empty path"
	}
	for rest := p; ; {
		seg, tail, more := strings.Cut(rest, "/")
		switch seg {
		case "":
			return "empty path segment (//) or trailing slash"
		case ".", "..":
			return "path segment " + quote(seg) + " is not allowed"
		}
		if !more {
			return ""
		}
		rest = tail
	}
}

// redactURI drops anything that could be user info from a URI before it goes
// into an error: everything between "://" and an "@" in the authority.
func redactURI(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return uri
	}
	auth, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(auth, "@"); i >= 0 {
		auth = "<redacted>@" + auth[i+1:]
		return scheme + "://" + auth + "/" + path
	}
	return uri
}
