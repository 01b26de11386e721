package gateway

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// Poll timing of waits: a job's state is read again after pollMin, then
// after intervals growing by half up to pollMax, so a small job is seen
// done within milliseconds and a long one costs Redis about 1/pollMax
// reads a second. statusParallel bounds the reads one wait makes at once.
const (
	pollMin        = 5 * time.Millisecond
	pollMax        = 250 * time.Millisecond
	statusParallel = 8
)

// status is GET /v1/jobs/{id}.
func (s *Server) status(w http.ResponseWriter, r *http.Request) *apiError {
	id := r.PathValue("id")
	if e := checkID(id); e != nil {
		return e
	}
	st, err := s.cfg.Client.Status(r.Context(), id)
	if err != nil {
		return jobError(id, err)
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// wait is GET /v1/jobs/{id}/wait?timeout=SECONDS: it answers once the job
// completed or failed, or when the timeout ends with the job's state then
// (pending or active: ask again).
func (s *Server) wait(w http.ResponseWriter, r *http.Request) *apiError {
	id := r.PathValue("id")
	if e := checkID(id); e != nil {
		return e
	}
	d, e := s.waitTimeout(r.URL.Query().Get("timeout"))
	if e != nil {
		return e
	}
	items := s.waitAll(r.Context(), []string{id}, d)
	if items[0].err != nil {
		return jobError(id, items[0].err)
	}
	writeJSON(w, http.StatusOK, items[0].st)
	return nil
}

// waitRequest is POST /v1/jobs/wait's body.
type waitRequest struct {
	IDs     []string `json:"ids"`
	Timeout *float64 `json:"timeout"` // seconds
}

// waitAnswer is one job of a batch wait: its status, or the error reading
// it (an unknown id).
type waitAnswer struct {
	*jobs.Status
	ID    string    `json:"id"`
	Error *apiError `json:"error,omitempty"`
}

// waitBatch is POST /v1/jobs/wait: it answers once every job completed,
// failed or is unknown, or when the timeout ends; done says which.
func (s *Server) waitBatch(w http.ResponseWriter, r *http.Request) *apiError {
	body, e := s.readBody(w, r, s.cfg.MaxBodyBytes)
	if e != nil {
		return e
	}
	var req waitRequest
	if e := decodeStrict(body, &req); e != nil {
		return e
	}
	if len(req.IDs) == 0 {
		return newErr(http.StatusBadRequest, CodeInvalidRequest, "ids: no job ids given")
	}
	if len(req.IDs) > s.cfg.MaxBatch {
		return newErr(http.StatusRequestEntityTooLarge, CodeTooLarge, "wait for %d jobs, limit %d (limits.max_batch)", len(req.IDs), s.cfg.MaxBatch)
	}
	for _, id := range req.IDs {
		if e := checkID(id); e != nil {
			return e
		}
	}
	t := ""
	if req.Timeout != nil {
		t = strconv.FormatFloat(*req.Timeout, 'g', -1, 64)
	}
	d, e := s.waitTimeout(t)
	if e != nil {
		return e
	}
	items := s.waitAll(r.Context(), req.IDs, d)
	out := make([]waitAnswer, len(items))
	done := true
	for i, it := range items {
		out[i] = waitAnswer{Status: it.st, ID: req.IDs[i]}
		if it.err != nil {
			out[i].Error = jobError(req.IDs[i], it.err)
			continue
		}
		done = done && terminal(it.st.State)
	}
	writeJSON(w, http.StatusOK, struct {
		Done bool         `json:"done"`
		Jobs []waitAnswer `json:"jobs"`
	}{done, out})
	return nil
}

// waitTimeout parses a timeout in seconds ("" is the default), capped at
// the gateway's limit.
func (s *Server) waitTimeout(v string) (time.Duration, *apiError) {
	if v == "" {
		return s.cfg.DefaultWait, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f < 0 || math.IsInf(f, 0) {
		return 0, newErr(http.StatusBadRequest, CodeInvalidRequest, "timeout %q: want seconds >= 0 (at most %v)", v, s.cfg.MaxWait.Seconds())
	}
	return min(time.Duration(f*float64(time.Second)), s.cfg.MaxWait), nil
}

func terminal(st jobs.State) bool { return st == jobs.StateCompleted || st == jobs.StateFailed }

type waitItem struct {
	st  *jobs.Status
	err error
}

// waitAll reads each job's state until it completed, failed or is unknown,
// or d ends (or the request does): each job is read again after its own
// growing interval (pollMin to pollMax), at most statusParallel at once.
func (s *Server) waitAll(ctx context.Context, ids []string, d time.Duration) []waitItem {
	deadline := time.Now().Add(d)
	items := make([]waitItem, len(ids))
	next := make([]time.Time, len(ids))
	gap := make([]time.Duration, len(ids))
	open := make([]int, len(ids))
	for i := range ids {
		open[i], gap[i] = i, pollMin
	}
	sem := make(chan struct{}, statusParallel)
	for {
		now := time.Now()
		var wg sync.WaitGroup
		for _, i := range open {
			if next[i].After(now) {
				continue
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				st, err := s.cfg.Client.Status(ctx, ids[i])
				items[i] = waitItem{st, err}
				next[i] = time.Now().Add(gap[i])
				gap[i] = min(gap[i]*3/2, pollMax)
			})
		}
		wg.Wait()
		still := open[:0]
		wake := deadline
		for _, i := range open {
			if it := items[i]; it.err == nil && !terminal(it.st.State) {
				still = append(still, i)
				if next[i].Before(wake) {
					wake = next[i]
				}
			}
		}
		open = still
		if len(open) == 0 || !time.Now().Before(deadline) || ctx.Err() != nil {
			break
		}
		t := time.NewTimer(time.Until(wake))
		select {
		case <-ctx.Done():
		case <-s.drain:
			t.Stop()
			return items
		case <-t.C:
		}
		t.Stop()
	}
	return items
}
