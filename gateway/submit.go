package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// validID reports whether a client-chosen job id has the form
// ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$ (openapi.yaml's JobID): it goes into
// URLs and Redis keys as it is.
func validID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == ':' || c == '-'):
		default:
			return false
		}
	}
	return true
}

func checkID(id string) *apiError {
	if !validID(id) {
		return newErr(http.StatusBadRequest, CodeInvalidRequest, "job id %q: want 1-128 of A-Z a-z 0-9 . _ : - starting with a letter or digit", id)
	}
	return nil
}

// submitted is the answer to a job posted: its id and queue.
type submitted struct {
	ID    string `json:"id"`
	Queue string `json:"queue"`
}

// submit is POST /v1/jobs[?id=ID]: the body is the job, exactly the queue
// payload's schema.
func (s *Server) submit(w http.ResponseWriter, r *http.Request) *apiError {
	id := r.URL.Query().Get("id")
	if id != "" {
		if e := checkID(id); e != nil {
			return e
		}
	}
	body, e := s.readBody(w, r, min(s.cfg.MaxBodyBytes, jobs.MaxPayloadBytes))
	if e != nil {
		return e
	}
	got, e := s.enqueue(r.Context(), id, body)
	if e != nil {
		return e
	}
	writeJSON(w, http.StatusAccepted, submitted{ID: got, Queue: s.cfg.Client.Queue()})
	return nil
}

// batchRequest is POST /v1/jobs/batch's body.
type batchRequest struct {
	Jobs []batchItem `json:"jobs"`
}

type batchItem struct {
	ID  string          `json:"id"`
	Job json.RawMessage `json:"job"`
}

// batchAnswer is one job's answer in a batch: Status is the code the job
// would have had on its own (202 enqueued).
type batchAnswer struct {
	Index  int       `json:"index"`
	ID     string    `json:"id,omitempty"`
	Queue  string    `json:"queue,omitempty"`
	Status int       `json:"status"`
	Error  *apiError `json:"error,omitempty"`
}

// enqueueParallel is how many jobs of one batch are enqueued at once: each
// is a Redis round trip.
const enqueueParallel = 32

// submitBatch is POST /v1/jobs/batch: each job is decoded, checked and
// enqueued on its own, and answered in order; one bad job does not stop
// the others.
func (s *Server) submitBatch(w http.ResponseWriter, r *http.Request) *apiError {
	body, e := s.readBody(w, r, s.cfg.MaxBodyBytes)
	if e != nil {
		return e
	}
	var req batchRequest
	items, fast := splitBatch(body)
	if fast {
		req.Jobs = items
	} else if e := decodeStrict(body, &req); e != nil {
		return e
	}
	if len(req.Jobs) == 0 {
		return newErr(http.StatusBadRequest, CodeInvalidRequest, "jobs: the batch is empty")
	}
	if len(req.Jobs) > s.cfg.MaxBatch {
		return newErr(http.StatusRequestEntityTooLarge, CodeTooLarge, "batch of %d jobs, limit %d (limits.max_batch)", len(req.Jobs), s.cfg.MaxBatch)
	}
	// Every job is decoded and checked before any is enqueued: the fast
	// split delimits jobs without validating their bytes, so when one is
	// refused the whole body must be valid JSON (json.Valid), else the
	// answer is encoding/json's error for the body, as without the split.
	out := make([]batchAnswer, len(req.Jobs))
	js := make([]jobs.Job, len(req.Jobs))
	validated := !fast
	for i, it := range req.Jobs {
		out[i] = batchAnswer{Index: i, ID: it.ID}
		var e *apiError
		switch {
		case it.ID != "" && !validID(it.ID):
			e = checkID(it.ID)
		case len(it.Job) == 0:
			e = newErr(http.StatusBadRequest, CodeInvalidRequest, "jobs[%d]: no job object", i)
		default:
			js[i], e = s.check(it.ID, it.Job)
		}
		if e == nil {
			continue
		}
		if !validated {
			if !json.Valid(body) {
				return decodeStrict(body, &req)
			}
			validated = true
		}
		out[i].Status, out[i].Error = e.Status, e
	}
	// enqueueParallel goroutines take the jobs in turn (one goroutine a
	// job cost the scheduler more than the jobs' checks).
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(enqueueParallel, len(req.Jobs)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(req.Jobs) {
					return
				}
				if out[i].Error != nil {
					continue
				}
				id, e := s.enqueueJob(r.Context(), req.Jobs[i].ID, js[i])
				if e != nil {
					out[i].Status, out[i].Error = e.Status, e
					continue
				}
				out[i].ID, out[i].Queue, out[i].Status = id, s.cfg.Client.Queue(), http.StatusAccepted
			}
		})
	}
	wg.Wait()
	writeBatch(w, out)
	return nil
}

// writeBatch writes {"jobs":[...]} as writeJSON would, byte for byte
// (TestWriteBatch), without reflection for the jobs enqueued: one answer a
// job is most of what a batch costs the gateway beyond the enqueues.
func writeBatch(w http.ResponseWriter, out []batchAnswer) {
	b := make([]byte, 0, 16+80*len(out))
	b = append(b, `{"jobs":[`...)
	for i, a := range out {
		if i > 0 {
			b = append(b, ',')
		}
		if a.Error != nil || !plainJSON(a.ID) || !plainJSON(a.Queue) {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(a); err != nil {
				writeError(w, newErr(http.StatusInternalServerError, CodeInternal, "encoding the answer failed"))
				return
			}
			b = append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
			continue
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(a.Index), 10)
		if a.ID != "" {
			b = append(b, `,"id":"`...)
			b = append(b, a.ID...)
			b = append(b, '"')
		}
		if a.Queue != "" {
			b = append(b, `,"queue":"`...)
			b = append(b, a.Queue...)
			b = append(b, '"')
		}
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(a.Status), 10)
		b = append(b, '}')
	}
	b = append(b, "]}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// plainJSON reports whether s needs no escaping in a JSON string.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// enqueue decodes payload strictly (jobs.Decode, the worker's own
// decoder), checks its URIs against the allow-list, and enqueues it under
// id ("" lets asynq choose one).
func (s *Server) enqueue(ctx context.Context, id string, payload []byte) (string, *apiError) {
	j, e := s.check(id, payload)
	if e != nil {
		return "", e
	}
	return s.enqueueJob(ctx, id, j)
}

// check decodes payload strictly and applies the allow-list.
func (s *Server) check(id string, payload []byte) (jobs.Job, *apiError) {
	j, err := jobs.Decode(payload)
	if err != nil {
		s.metrics.jobsRejected.Inc()
		return j, jobError(id, namedJobError(id, "", "", err))
	}
	if s.cfg.Store != nil {
		checked := "" // the object of the last input checked
		for _, in := range [...]struct {
			name, uri string
			write     bool
		}{{"x", j.X, false}, {"w", j.W, false}, {"dy", j.DY, false}, {"out", j.Out, true}} {
			// x, w and dy are often tensors of one object: the allow-list
			// is by object, so one check of it serves all (a #name only
			// needs to be there and plain).
			if obj, name, ok := strings.Cut(in.uri, "#"); !in.write && ok && obj == checked && plainName(name) {
				continue
			}
			if err := s.cfg.Store.Check(in.uri, in.write); err != nil {
				s.metrics.jobsRejected.Inc()
				return j, jobError(id, namedJobError(id, in.name, in.uri, err))
			}
			checked, _, _ = strings.Cut(in.uri, "#")
		}
	}
	return j, nil
}

// plainName reports whether a tensor name is one storage.ParseRef takes as
// it is: not empty, no control characters, no second #.
func plainName(n string) bool {
	if n == "" {
		return false
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; c < 0x20 || c == 0x7f || c == '#' {
			return false
		}
	}
	return true
}

// enqueueJob enqueues a checked job under id ("" lets asynq choose one).
func (s *Server) enqueueJob(ctx context.Context, id string, j jobs.Job) (string, *apiError) {
	var opts []asynq.Option
	if id != "" {
		opts = append(opts, asynq.TaskID(id))
	}
	got, err := s.cfg.Client.Enqueue(ctx, j, opts...)
	if err != nil {
		e := jobError(id, err)
		if e.Status == http.StatusServiceUnavailable {
			s.metrics.jobsError.Inc()
			s.log.Warn("enqueue failed", "job", id, "err", err)
		} else {
			s.metrics.jobsRejected.Inc()
		}
		return "", e
	}
	s.metrics.jobsEnqueued.Inc()
	return got, nil
}

// namedJobError is the worker's error for a job: jobs.NewJobError, whose
// message starts "job <id>: "; a job posted without an id has none to
// name, and its message starts at the tensor.
func namedJobError(id, tensor, uri string, err error) error {
	je := jobs.NewJobError(id, tensor, uri, err)
	if id != "" {
		return je
	}
	return &anonJobError{je}
}

type anonJobError struct{ je *jobs.JobError }

func (e *anonJobError) Error() string { return strings.TrimPrefix(e.je.Error(), "job : ") }
func (e *anonJobError) Unwrap() error { return e.je }

// readBody reads a request body of at most limit bytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *apiError) {
	tooLarge := func() *apiError {
		return newErr(http.StatusRequestEntityTooLarge, CodeTooLarge, "request body over %d bytes, the limit of %s %s", limit, r.Method, r.URL.Path)
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, tooLarge()
	}
	if err != nil {
		return nil, newErr(http.StatusBadRequest, CodeInvalidRequest, "reading the request body: %v", err)
	}
	return b, nil
}

// decodeStrict decodes one JSON object into v: unknown fields and trailing
// data are errors, as in the queue payload.
func decodeStrict(body []byte, v any) *apiError {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return newErr(http.StatusBadRequest, CodeInvalidRequest, "malformed JSON body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return newErr(http.StatusBadRequest, CodeInvalidRequest, "malformed JSON body: trailing data after the JSON object")
	}
	return nil
}
