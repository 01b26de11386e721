package jobs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/storage"
)

// ErrNonFinite is wrapped when an input contains NaN or Inf, or an output
// came out non-finite. Both are permanent: the same inputs give the same
// bytes again, and a silently non-finite gradient is worse than an error.
var ErrNonFinite = errors.New("non-finite values")

// ErrLimit is wrapped when a job's tensors break a configured limit.
var ErrLimit = errors.New("over the job limit")

// JobError is every error a handler returns: it names the job, the tensor
// and its URI where one is involved. A permanent one also wraps
// asynq.SkipRetry, so asynq archives the task at once with this message.
type JobError struct {
	JobID     string
	Tensor    string // "x", "w", "dy", "out", "dx", ... or "" for the job as a whole
	URI       string
	Permanent bool
	Err       error
	// OutageStreak is, for an outage (IsOutage) met while the job ran,
	// how many in a row this worker has seen for the task: RetryDelay
	// backs off by it, since asynq does not count outages.
	OutageStreak int
}

func (e *JobError) Error() string {
	s := "job " + e.JobID
	if e.Tensor != "" {
		s += ": tensor " + e.Tensor
	}
	if e.URI != "" {
		s += " (" + e.URI + ")"
	}
	return s + ": " + e.Err.Error()
}

// Unwrap exposes the cause, and asynq.SkipRetry for a permanent error.
func (e *JobError) Unwrap() []error {
	if e.Permanent {
		return []error{e.Err, asynq.SkipRetry}
	}
	return []error{e.Err}
}

// IsPermanent reports whether err is one retrying the job cannot fix: an
// invalid payload or signature, a storage error storage.Permanent calls
// permanent, a limit, a job that never fits the budget, a compute argument
// error, non-finite values, or a w that does not hash to the job's pin.
//
// storage.ErrAccess is the exception: credentials refused are the worker's
// configuration, not the job (the allow-list already keeps jobs to the
// buckets the worker may use), so the job is retried with backoff, and
// another worker, or this one once its secret is fixed, runs it. Archiving
// it would let one worker with a stale key empty the queue into the archive.
func IsPermanent(err error) bool {
	var je *JobError
	if errors.As(err, &je) {
		return je.Permanent
	}
	for _, e := range []error{ErrInvalidJob, ErrBadSignature, ErrLimit, ErrNeverFits, ErrNonFinite, ErrPinMismatch, compute.ErrInvalidArgument, asynq.SkipRetry} {
		if errors.Is(err, e) {
			return true
		}
	}
	if errors.Is(err, storage.ErrAccess) {
		return false
	}
	return storage.Permanent(err)
}

// NewJobError returns the error a handler would give for err on job id's
// tensor at uri ("" for the job as a whole): the same message, the URI's
// user info redacted, Permanent from IsPermanent. Front ends that check a
// job before enqueuing it (the HTTP gateway) answer with it.
func NewJobError(id, tensor, uri string, err error) *JobError { return jobErr(id, tensor, uri, err) }

func jobErr(id, tensor, uri string, err error) *JobError {
	return &JobError{JobID: id, Tensor: tensor, URI: redactUserinfo(uri), Permanent: IsPermanent(err), Err: err}
}

// redactUserinfo hides anything between "://" and an "@" in a URI's
// authority: a job that smuggles credentials into a URI (which the storage
// layer rejects) must not have them repeated in its error, the task's
// last_error and the worker's logs.
func redactUserinfo(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return uri
	}
	auth, path, hasPath := strings.Cut(rest, "/")
	i := strings.LastIndex(auth, "@")
	if i < 0 {
		return uri
	}
	s := scheme + "://<redacted>@" + auth[i+1:]
	if hasPath {
		s += "/" + path
	}
	return s
}

func limitErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrLimit, fmt.Sprintf(format, args...))
}

func shapeErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidJob, fmt.Sprintf(format, args...))
}
