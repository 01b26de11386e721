package jobs

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"

	"github.com/rmsgrad/rmsgrad/compute"
)

// TaskType is the asynq task type of an RMSNorm-backward job.
const TaskType = "rmsnorm:backward"

// DefaultQueue is the asynq queue jobs go to unless told otherwise.
const DefaultQueue = "rmsnorm"

// Version is the payload schema version this code reads and writes.
const Version = 1

// MaxPayloadBytes bounds a payload: it carries URIs, never tensor bytes, and
// asynq's heartbeat rewrites payloads, so they must stay small.
const MaxPayloadBytes = 16 << 10

// Output names.
const (
	OutDX = "dx"
	OutDW = "dw"
	OutR  = "r"
)

// DefaultOutputs is what a job produces when it names no outputs.
var DefaultOutputs = []string{OutDX, OutDW}

// Job is the payload of one RMSNorm-backward task: where its three inputs
// are, where its output goes, and eps.
//
// The output object is one safetensors file holding the requested outputs
// under their names; dx has x's shape, dw is [D], r is [rows]. Inputs may
// each be F32, BF16 or F16 (their headers say which); dx is in x's dtype
// and dw in w's (what autograd gives) unless GradDType names one dtype for
// both; r is always F32.
type Job struct {
	V       int      `json:"v"`
	X       string   `json:"x"`
	W       string   `json:"w"`
	DY      string   `json:"dy"`
	Out     string   `json:"out"`
	Eps     float64  `json:"eps"`
	Outputs []string `json:"outputs,omitempty"`
	// GradDType is the dtype of both gradients, dx and dw: "F32", "BF16"
	// or "F16", spelt as safetensors spells them. Empty (the default): dx
	// in x's dtype and dw in w's. "F32" is the common choice for a dw
	// summed over many microbatches.
	GradDType string `json:"grad_dtype,omitempty"`
	// WSHA256 pins w: the lowercase hex SHA-256 of w's tensor data bytes
	// (what Result.SHA256 and the sha256.<name> metadata hold for a
	// tensor). A worker checks w against it, failing the job permanently
	// on a mismatch, and may then serve later jobs that name the same w
	// with the same pin from memory, without a request (see PinCache).
	// Empty: w is read for every job and not checked.
	WSHA256 string `json:"w_sha256,omitempty"`
	// EnqueuedNS is the enqueue time (Unix nanoseconds), set by Client.Enqueue
	// so the worker can report queue wait.
	EnqueuedNS int64 `json:"enqueued_ns,omitempty"`
	// Sig is the hex HMAC-SHA256 of the payload with Sig empty, present when
	// the enqueue side holds a signing key.
	Sig string `json:"sig,omitempty"`
}

// ErrInvalidJob is wrapped by every error about a job's payload or inputs
// that a retry cannot fix.
var ErrInvalidJob = errors.New("invalid job")

// ErrBadSignature is wrapped when a signing key is configured and the job's
// signature is missing or wrong.
var ErrBadSignature = errors.New("bad job signature")

// FieldError names the field of a job that is wrong and why.
type FieldError struct {
	Field string // "eps", "out", "outputs", "payload", ...
	Msg   string
}

func (e *FieldError) Error() string { return fmt.Sprintf("invalid job: %s: %s", e.Field, e.Msg) }

// Is makes errors.Is(err, ErrInvalidJob) true.
func (e *FieldError) Is(target error) bool { return target == ErrInvalidJob }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Decode parses a payload strictly: one JSON object, no unknown fields, a
// known version, then Validate.
func Decode(payload []byte) (Job, error) {
	var j Job
	if len(payload) > MaxPayloadBytes {
		return j, fieldErr("payload", "%d bytes, limit %d", len(payload), MaxPayloadBytes)
	}
	j, ok := decodeFast(payload)
	if !ok {
		var err error
		if j, err = decodeSlow(payload); err != nil {
			return Job{}, err
		}
	}
	if err := j.Validate(); err != nil {
		return Job{}, err
	}
	// The limit holds for the job's encoding (Payload) too, which escapes
	// what the payload may have carried raw (<, > and & become six bytes
	// each, invalid UTF-8 three): a job accepted here always re-encodes to
	// a payload accepted here. An encoding grows at most six times, so
	// only long payloads are encoded to check.
	if len(payload) > MaxPayloadBytes/maxEncodingGrowth {
		if b, err := json.Marshal(&j); err == nil && len(b) > MaxPayloadBytes {
			return Job{}, fieldErr("payload", "%d bytes as encoded (%d as sent), limit %d", len(b), len(payload), MaxPayloadBytes)
		}
	}
	return j, nil
}

// maxEncodingGrowth bounds how many times longer encoding/json's encoding
// of a decoded payload can be than the payload: a raw '<' becomes the six
// bytes \u003c.
const maxEncodingGrowth = 6

// decodeSlow is the reference decoder, on encoding/json: it reports every
// way a payload can be malformed. Decode runs it when decodeFast does not
// accept the payload.
func decodeSlow(payload []byte) (Job, error) {
	var j Job
	if err := checkKeys(payload); err != nil {
		return Job{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return Job{}, fieldErr("payload", "malformed JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Job{}, fieldErr("payload", "trailing data after the JSON object")
	}
	return j, nil
}

// payloadKeys are the payload's field names, exactly as Job's json tags
// spell them.
var payloadKeys = func() map[string]bool {
	m := map[string]bool{}
	t := reflect.TypeFor[Job]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			m[name] = true
		}
	}
	return m
}()

// checkKeys rejects what encoding/json would let through: a key spelt in
// another case ("OUT" or "Out" fill Out) and a key given twice (the last
// wins). Either lets a proxy or an auditor that reads the raw JSON see a
// different job than the worker runs.
func checkKeys(payload []byte) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil // not an object: the strict decode reports it
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		k, _ := t.(string)
		if !payloadKeys[k] {
			return fieldErr("payload", "unknown field %q (field names are exact and lowercase)", k)
		}
		if seen[k] {
			return fieldErr("payload", "field %q given twice", k)
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// Validate checks what can be checked without reading any tensor.
func (j *Job) Validate() error {
	if j.V != Version {
		return fieldErr("v", "version %d not supported (this worker reads v%d)", j.V, Version)
	}
	for _, f := range []struct{ name, v string }{{"x", j.X}, {"w", j.W}, {"dy", j.DY}, {"out", j.Out}} {
		if f.v == "" {
			return fieldErr(f.name, "missing tensor URI")
		}
	}
	if math.IsNaN(j.Eps) || math.IsInf(j.Eps, 0) || j.Eps <= 0 {
		return fieldErr("eps", "must be finite and > 0, got %v", j.Eps)
	}
	if float32(j.Eps) == 0 || math.IsInf(float64(float32(j.Eps)), 0) {
		return fieldErr("eps", "%v is not representable as a positive finite float32", j.Eps)
	}
	if j.GradDType != "" && !compute.DType(j.GradDType).Valid() {
		return fieldErr("grad_dtype", "%q is not a dtype rmsgrad computes (want one of F32, BF16, F16, as safetensors spells them, or omit it for dx like x and dw like w)", j.GradDType)
	}
	if j.WSHA256 != "" && !isSHA256Hex(j.WSHA256) {
		return fieldErr("w_sha256", "want the 64 lowercase hex digits of a SHA-256, got %d characters%s", len(j.WSHA256), hexHint(j.WSHA256))
	}
	seen := map[string]bool{}
	for _, o := range j.Outputs {
		switch o {
		case OutDX, OutDW, OutR:
		default:
			return fieldErr("outputs", "unknown output %q (want any of dx, dw, r)", o)
		}
		if seen[o] {
			return fieldErr("outputs", "output %q listed twice", o)
		}
		seen[o] = true
	}
	for _, in := range []struct{ name, v string }{{"x", j.X}, {"w", j.W}, {"dy", j.DY}} {
		if sameObject(j.Out, in.v) {
			return fieldErr("out", "%q is also input %s: the output would overwrite an input", j.Out, in.name)
		}
	}
	return nil
}

// isSHA256Hex reports whether s is 64 lowercase hex digits.
func isSHA256Hex(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// hexHint says what is wrong with a would-be hex digest of the right
// length.
func hexHint(s string) string {
	if len(s) != 2*sha256.Size {
		return ""
	}
	if strings.ToLower(s) != s {
		return " (upper case: write it in lower case)"
	}
	return " (not all hex digits)"
}

// sameObject compares two tensor URIs without their #name fragment: an
// output object replaces the whole object, whatever tensor names it holds.
func sameObject(a, b string) bool {
	return stripFragment(a) == stripFragment(b)
}

func stripFragment(u string) string {
	for i := 0; i < len(u); i++ {
		if u[i] == '#' {
			return u[:i]
		}
	}
	return u
}

// GradDTypes returns the dtypes of dx and dw for inputs x and w of the
// given dtypes: GradDType for both when set, else x's and w's.
func (j *Job) GradDTypes(x, w compute.DType) (dx, dw compute.DType) {
	if j.GradDType != "" {
		return compute.DType(j.GradDType), compute.DType(j.GradDType)
	}
	return x, w
}

// WantOutputs returns the outputs the job produces, in canonical order.
func (j *Job) WantOutputs() []string {
	if len(j.Outputs) == 0 {
		return DefaultOutputs
	}
	out := make([]string, 0, 3)
	for _, o := range []string{OutDX, OutDW, OutR} {
		if slices.Contains(j.Outputs, o) {
			out = append(out, o)
		}
	}
	return out
}

// Payload encodes the job; an encoding over MaxPayloadBytes is an
// ErrInvalidJob error (workers would refuse it).
func (j *Job) Payload() ([]byte, error) {
	if j.V == 0 {
		j.V = Version
	}
	b, err := json.Marshal(j)
	if err == nil && len(b) > MaxPayloadBytes {
		return nil, fieldErr("payload", "%d bytes as encoded, limit %d", len(b), MaxPayloadBytes)
	}
	return b, err
}

// Sign sets Sig to the HMAC-SHA256 of the payload with Sig empty.
func (j *Job) Sign(key []byte) error {
	j.Sig = ""
	if j.V == 0 {
		j.V = Version
	}
	mac, err := j.mac(key)
	if err != nil {
		return err
	}
	j.Sig = hex.EncodeToString(mac)
	return nil
}

// Verify checks Sig against key in constant time.
func (j *Job) Verify(key []byte) error {
	if j.Sig == "" {
		return fmt.Errorf("%w: job is unsigned and this worker requires signed jobs", ErrBadSignature)
	}
	got, err := hex.DecodeString(j.Sig)
	if err != nil {
		return fmt.Errorf("%w: sig is not hex", ErrBadSignature)
	}
	want, err := j.mac(key)
	if err != nil {
		return err
	}
	if !hmac.Equal(got, want) {
		return fmt.Errorf("%w: signature does not match the payload (tampered or signed with another key)", ErrBadSignature)
	}
	return nil
}

func (j *Job) mac(key []byte) ([]byte, error) {
	c := *j
	c.Sig = ""
	b, err := json.Marshal(&c)
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return m.Sum(nil), nil
}
