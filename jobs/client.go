package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hibiken/asynq"
)

// DefaultRetention is how long a completed job's result is kept in Redis so
// that clients can read it.
const DefaultRetention = 24 * time.Hour

// Client enqueues jobs and waits for their results. It is safe for
// concurrent use.
type Client struct {
	c         *asynq.Client
	insp      *asynq.Inspector
	queue     string
	retention time.Duration
	maxRetry  int
	timeout   time.Duration
	signKey   []byte
	poll      time.Duration
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithQueue sets the queue jobs are enqueued to and looked up in.
func WithQueue(q string) ClientOption { return func(c *Client) { c.queue = q } }

// WithRetention sets how long results are kept after completion.
func WithRetention(d time.Duration) ClientOption { return func(c *Client) { c.retention = d } }

// WithMaxRetry sets how many times a job failing transiently is retried.
func WithMaxRetry(n int) ClientOption { return func(c *Client) { c.maxRetry = n } }

// WithTimeout sets the per-attempt processing timeout of enqueued jobs.
func WithTimeout(d time.Duration) ClientOption { return func(c *Client) { c.timeout = d } }

// WithSigningKey signs every enqueued job with HMAC-SHA256 under key.
func WithSigningKey(key []byte) ClientOption { return func(c *Client) { c.signKey = key } }

// WithPollInterval sets the longest interval between status polls in Wait.
func WithPollInterval(d time.Duration) ClientOption { return func(c *Client) { c.poll = d } }

// NewClient returns a client on the Redis that r describes.
func NewClient(r asynq.RedisConnOpt, opts ...ClientOption) *Client {
	c := &Client{
		c:         asynq.NewClient(r),
		insp:      asynq.NewInspector(r),
		queue:     DefaultQueue,
		retention: DefaultRetention,
		maxRetry:  10,
		timeout:   10 * time.Minute,
		poll:      500 * time.Millisecond,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Close closes the client's connections.
func (c *Client) Close() error {
	return errors.Join(c.c.Close(), c.insp.Close())
}

// Queue returns the queue the client uses.
func (c *Client) Queue() string { return c.queue }

// Enqueue validates j and enqueues it, returning the task id. Pass
// asynq.TaskID(id) to choose the id: enqueuing the same job under the same
// id again while the first task is still known to Redis (queued, running,
// or completed within its retention) is a no-op that returns the id, so a
// pipeline can retry an enqueue safely; a different job under a taken id is
// ErrIDReused.
func (c *Client) Enqueue(ctx context.Context, j Job, opts ...asynq.Option) (string, error) {
	j.V = Version
	if j.EnqueuedNS == 0 {
		j.EnqueuedNS = time.Now().UnixNano()
	}
	if err := j.Validate(); err != nil {
		return "", err
	}
	if c.signKey != nil {
		if err := j.Sign(c.signKey); err != nil {
			return "", err
		}
	}
	payload, err := j.Payload()
	if err != nil {
		return "", fmt.Errorf("encode job: %w", err)
	}
	all := append([]asynq.Option{
		asynq.Queue(c.queue),
		asynq.Retention(c.retention),
		asynq.MaxRetry(c.maxRetry),
		asynq.Timeout(c.timeout),
	}, opts...)
	info, err := c.c.EnqueueContext(ctx, asynq.NewTask(TaskType, payload), all...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		id, queue := optValue(all, asynq.TaskIDOpt), optValue(all, asynq.QueueOpt)
		if err := c.sameJob(queue, id, j); err != nil {
			return "", err
		}
		return id, nil
	}
	if err != nil {
		return "", fmt.Errorf("enqueue to queue %q: %w", c.queue, err)
	}
	return info.ID, nil
}

// ErrIDReused is returned by Enqueue when the caller's task id is already
// taken by a different job: the enqueue is not a retry of the earlier one.
var ErrIDReused = errors.New("task id already used by a different job")

// sameJob checks that the task already stored under id is the job j (its
// inputs, output, eps and outputs; the enqueue time and signature may
// differ), so that a retried enqueue is a no-op but reusing an id for
// another job is an error rather than a silently lost job. A task that
// vanished in between (its retention just ended) counts as the same job.
func (c *Client) sameJob(queue, id string, j Job) error {
	info, err := c.insp.GetTaskInfo(queue, id)
	if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("job %s: already enqueued; reading it back: %w", id, err)
	}
	var prev Job
	if err := json.Unmarshal(info.Payload, &prev); err != nil {
		return fmt.Errorf("job %s in queue %q: %w (the stored task is not an rmsgrad job)", id, queue, ErrIDReused)
	}
	if info.Type != TaskType || prev.X != j.X || prev.W != j.W || prev.DY != j.DY || prev.Out != j.Out ||
		prev.Eps != j.Eps || !slices.Equal(prev.WantOutputs(), j.WantOutputs()) {
		return fmt.Errorf("job %s in queue %q: %w (stored: x %s, out %s)", id, queue, ErrIDReused, prev.X, prev.Out)
	}
	return nil
}

// optValue returns the string value of the last option of type t.
func optValue(opts []asynq.Option, t asynq.OptionType) string {
	v := ""
	for _, o := range opts {
		if o.Type() == t {
			v, _ = o.Value().(string)
		}
	}
	return v
}

// Ping checks that Redis answers.
func (c *Client) Ping() error {
	if err := c.c.Ping(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}

// State is a job's state as the client sees it.
type State string

// Job states.
const (
	StatePending   State = "pending"   // queued, scheduled or waiting to retry
	StateActive    State = "active"    // a worker has it
	StateCompleted State = "completed" // done; the result is readable
	StateFailed    State = "failed"    // archived: permanent error or retries exhausted
)

// Status is a snapshot of one job.
type Status struct {
	ID       string  `json:"id"`
	Queue    string  `json:"queue"`
	State    State   `json:"state"`
	Retried  int     `json:"retried"`
	MaxRetry int     `json:"max_retry"`
	LastErr  string  `json:"last_error,omitempty"`
	Result   *Result `json:"result,omitempty"`
}

// ErrJobNotFound is returned for an id Redis does not know (never enqueued,
// or its retention expired).
var ErrJobNotFound = errors.New("job not found")

// JobFailedError is what Wait returns for a job that ended in failure.
type JobFailedError struct {
	ID      string
	Retried int
	Msg     string // the worker's error message
}

func (e *JobFailedError) Error() string {
	return fmt.Sprintf("job %s failed after %d retries: %s", e.ID, e.Retried, e.Msg)
}

// Status returns the job's current state.
func (c *Client) Status(ctx context.Context, id string) (*Status, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	info, err := c.insp.GetTaskInfo(c.queue, id)
	if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
		return nil, fmt.Errorf("job %s in queue %q: %w", id, c.queue, ErrJobNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("job %s: status: %w", id, err)
	}
	s := &Status{ID: id, Queue: info.Queue, Retried: info.Retried, MaxRetry: info.MaxRetry, LastErr: info.LastErr}
	switch info.State {
	case asynq.TaskStateActive:
		s.State = StateActive
	case asynq.TaskStateCompleted:
		s.State = StateCompleted
		var r Result
		if err := json.Unmarshal(info.Result, &r); err != nil {
			return nil, fmt.Errorf("job %s: result is not valid JSON: %w", id, err)
		}
		s.Result = &r
	case asynq.TaskStateArchived:
		s.State = StateFailed
	default:
		s.State = StatePending
	}
	return s, nil
}

// Wait polls until the job completes or fails, or ctx ends. A failed job
// returns a *JobFailedError carrying the worker's message.
func (c *Client) Wait(ctx context.Context, id string) (*Result, error) {
	delay := 20 * time.Millisecond
	for {
		s, err := c.Status(ctx, id)
		if err != nil {
			return nil, err
		}
		switch s.State {
		case StateCompleted:
			return s.Result, nil
		case StateFailed:
			return nil, &JobFailedError{ID: id, Retried: s.Retried, Msg: s.LastErr}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for job %s (state %s): %w", id, s.State, ctx.Err())
		case <-t.C:
		}
		delay = min(delay*2, c.poll)
	}
}
