package storage

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// Sentinel errors. Errors returned by this package and its stores wrap one
// of them (inside an *Error that names the operation, URI and tensor), so
// callers classify with errors.Is. Permanent reports true for the ones a
// retry cannot fix. ErrFormat, ErrDType and ErrTooLarge are the codec's own
// values, so errors from storage/safetensors match them too.
var (
	ErrNotFound    = errors.New("not found")          // object, bucket or tensor name missing
	ErrNotAllowed  = errors.New("not allowed")        // outside the allow-list, .., symlink escape
	ErrInvalidURI  = errors.New("invalid tensor URI") // malformed URI
	ErrFormat      = safetensors.ErrFormat            // malformed header, sizes inconsistent
	ErrDType       = safetensors.ErrDType             // a dtype we do not compute
	ErrTooLarge    = safetensors.ErrTooLarge          // over a configured limit
	ErrAccess      = errors.New("access denied")      // credentials rejected or permission missing
	ErrShortRead   = errors.New("short read")         // object ended early (transient)
	ErrChanged     = errors.New("object changed")     // replaced between Head and Fetch (transient: Head again)
	ErrUnavailable = errors.New("store unavailable")  // 5xx, timeouts, refused/reset connections after all retries
	ErrRejected    = errors.New("request rejected")   // any other 4xx answer, 501 or 505: the same request cannot succeed
	// ErrNotWritable: the output path can never be written as an object
	// (an existing directory, or a path under a regular file).
	ErrNotWritable = errors.New("path cannot be written")
)

// Permanent reports whether err is one a retry cannot fix: the worker skips
// retrying the job. Context cancellation is not permanent (the job was
// interrupted, not wrong).
func Permanent(err error) bool {
	for _, e := range []error{ErrNotFound, ErrNotAllowed, ErrInvalidURI, ErrFormat, ErrDType, ErrTooLarge, ErrAccess, ErrRejected, ErrNotWritable} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Error is the error every storage operation returns: which operation, on
// which URI (never with credentials) and which tensor, wrapping the cause
// (a sentinel, with the limit that was broken in its message).
type Error struct {
	Op     string // "head", "fetch", "write", "put", "check", "parse", "stat", "read"
	URI    string // the object or tensor URI
	Tensor string // tensor name, "" when the operation is on a whole object
	Err    error
}

// Error formats the operation, URI, tensor and cause on one line.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("storage: ")
	b.WriteString(e.Op)
	if e.URI != "" {
		b.WriteString(" ")
		b.WriteString(e.URI)
	}
	if e.Tensor != "" {
		b.WriteString(": tensor ")
		b.WriteString(strconv.Quote(e.Tensor))
	}
	b.WriteString(": ")
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the cause, so errors.Is(err, ErrNotFound) and friends work.
func (e *Error) Unwrap() error { return e.Err }

// wrap returns err as an *Error for op on ref, keeping an existing *Error's
// fields when the store already made one.
func wrap(op string, ref Ref, err error) error {
	if err == nil {
		return nil
	}
	var se *Error
	if errors.As(err, &se) {
		if se.Tensor == "" && ref.Name != "" {
			se.Tensor = ref.Name
		}
		return se
	}
	return &Error{Op: op, URI: ref.String(), Tensor: ref.Name, Err: err}
}

// errorf wraps sentinel with a formatted explanation: "sentinel: why".
func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}

// Errorf returns an error wrapping sentinel with a formatted explanation
// ("sentinel: explanation"), for stores to build their causes with.
func Errorf(sentinel error, format string, args ...any) error {
	return errorf(sentinel, format, args...)
}

func quote(s string) string { return strconv.Quote(s) }
