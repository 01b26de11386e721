package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
)

// Error codes of the API's JSON errors; openapi.yaml lists them.
const (
	CodeInvalidRequest = "invalid_request" // 400: the envelope, a query parameter or an id is malformed
	CodeInvalidJob     = "invalid_job"     // 400: the job breaks the payload schema (the worker's message)
	CodeUnauthorized   = "unauthorized"    // 401: no bearer token, or one no token file holds
	CodeNotAllowed     = "not_allowed"     // 403: a URI outside the allow-list
	CodeURLExpired     = "url_expired"     // 403: a file URL past its expiry
	CodeBadSignature   = "bad_signature"   // 403: a file URL whose signature does not match
	CodeNotFound       = "not_found"       // 404: no such job, object or route
	CodeMethod         = "method_not_allowed"
	CodeIDConflict     = "id_conflict"     // 409: the id is taken by a different job
	CodeLengthRequired = "length_required" // 411: an upload without Content-Length
	CodeTooLarge       = "too_large"       // 413: a body over its limit
	CodeRateLimited    = "rate_limited"    // 429: over the token's rate; Retry-After says when to come back
	CodeInternal       = "internal"        // 500
	CodeUnavailable    = "unavailable"     // 503: Redis or a store did not answer
)

// apiError is the body of every error answer: {"error": {...}}. Message is
// the worker's message for the same fault where there is one (job, tensor,
// URI and the rule broken); Job, Tensor, URI and Field repeat its parts for
// programs.
type apiError struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Job     string `json:"job,omitempty"`
	Tensor  string `json:"tensor,omitempty"`
	URI     string `json:"uri,omitempty"`
	Field   string `json:"field,omitempty"`
}

func (e *apiError) Error() string { return e.Message }

// String makes an apiError print with its status and code in logs.
func (e *apiError) String() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

func newErr(status int, code, format string, args ...any) *apiError {
	return &apiError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// jobError turns an error about job id (from validation, the allow-list or
// Enqueue) into its API error.
func jobError(id string, err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	e := &apiError{Message: err.Error()}
	var je *jobs.JobError
	if errors.As(err, &je) {
		e.Job, e.Tensor, e.URI = je.JobID, je.Tensor, je.URI
	} else if id != "" {
		e.Job = id
	}
	var fe *jobs.FieldError
	if errors.As(err, &fe) {
		e.Field = fe.Field
	}
	switch {
	case errors.Is(err, jobs.ErrIDReused):
		e.Status, e.Code = http.StatusConflict, CodeIDConflict
	case errors.Is(err, storage.ErrNotAllowed):
		e.Status, e.Code = http.StatusForbidden, CodeNotAllowed
	case errors.Is(err, jobs.ErrInvalidJob), errors.Is(err, storage.ErrInvalidURI):
		e.Status, e.Code = http.StatusBadRequest, CodeInvalidJob
	case errors.Is(err, jobs.ErrJobNotFound):
		e.Status, e.Code = http.StatusNotFound, CodeNotFound
	default:
		// Everything else Enqueue and Status return is Redis's.
		e.Status, e.Code = http.StatusServiceUnavailable, CodeUnavailable
	}
	return e
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // URLs keep their & as it is
	var b []byte
	if err := enc.Encode(v); err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"encoding the answer failed"}}`+"\n")
	} else {
		b = buf.Bytes()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// writeError writes e as {"error": e}.
func writeError(w http.ResponseWriter, e *apiError) {
	if e.Status == 0 {
		e.Status = http.StatusInternalServerError
	}
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="rmsgrad"`)
	}
	writeJSON(w, e.Status, struct {
		Error *apiError `json:"error"`
	}{e})
}
