package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// DefaultRetention is how long a completed job's result is kept in Redis so
// that clients can read it.
const DefaultRetention = 24 * time.Hour

// Client enqueues jobs and waits for their results. It is safe for
// concurrent use.
type Client struct {
	rdb       redis.UniversalClient
	c         *asynq.Client
	insp      *asynq.Inspector
	queue     string
	shards    int // configured shard count; 0 follows Redis's record
	layout    *layoutCache
	retention time.Duration
	maxRetry  int
	timeout   time.Duration
	signKey   []byte
	poll      time.Duration
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithQueue sets the logical queue jobs are enqueued to and looked up in.
func WithQueue(q string) ClientOption { return func(c *Client) { c.queue = q } }

// WithShards says how many shards the client expects the queue to have:
// when Redis records another number, Enqueue and Status fail with
// ErrLayoutMismatch instead of using it. 0 (the default) follows the
// record, which is absent (one shard) until a reshard writes it.
func WithShards(n int) ClientOption { return func(c *Client) { c.shards = n } }

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

// NewClient returns a client on the Redis (one server, Sentinel or a
// Cluster) that r describes.
func NewClient(r asynq.RedisConnOpt, opts ...ClientOption) *Client {
	rdb, ok := r.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		panic(fmt.Sprintf("jobs: unsupported RedisConnOpt type %T", r))
	}
	c := &Client{
		rdb:       rdb,
		c:         asynq.NewClientFromRedisClient(rdb),
		insp:      asynq.NewInspectorFromRedisClient(rdb),
		queue:     DefaultQueue,
		retention: DefaultRetention,
		maxRetry:  10,
		timeout:   10 * time.Minute,
		poll:      500 * time.Millisecond,
	}
	for _, o := range opts {
		o(c)
	}
	c.layout = &layoutCache{rdb: rdb, queue: c.queue}
	return c
}

// Close closes the client's connections.
func (c *Client) Close() error { return c.rdb.Close() }

// Queue returns the logical queue the client uses.
func (c *Client) Queue() string { return c.queue }

// Layout returns the queue's layout (LayoutRefresh old at most), checked
// against the configured shard count.
func (c *Client) Layout(ctx context.Context) (Layout, error) {
	l, err := c.layout.get(ctx)
	if err != nil {
		return l, err
	}
	return l, checkShards(l, c.shards)
}

// Enqueue validates j and enqueues it, returning the task id. Pass
// asynq.TaskID(id) to choose the id: enqueuing the same job under the same
// id again while the first task is still known to Redis (queued, running,
// or completed within its retention) is a no-op that returns the id, so a
// pipeline can retry an enqueue safely; a different job under a taken id is
// ErrIDReused. On a sharded queue the task goes to the shard of its id
// (ShardOf; the client makes a UUID id when none is given), and while a
// reshard is draining the queue Enqueue returns ErrResharding.
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
	l, err := c.Layout(ctx)
	if err != nil {
		return "", fmt.Errorf("enqueue to queue %q: %w", c.queue, err)
	}
	if l.To != 0 {
		return "", fmt.Errorf("enqueue to queue %q: %w from %d to %d shards ('enqueue reshard' is draining the old ones); retry once it has finished",
			c.queue, ErrResharding, l.Shards, l.To)
	}
	id := optValue(opts, asynq.TaskIDOpt)
	queue := c.queue
	if l.Shards > 1 {
		if q := optValue(opts, asynq.QueueOpt); q != "" {
			return "", fmt.Errorf("enqueue: asynq.Queue(%q) given, but queue %q has %d shards and the client picks the shard from the task id", q, c.queue, l.Shards)
		}
		if id == "" {
			id = uuid.NewString()
			opts = append(slices.Clip(opts), asynq.TaskID(id))
		}
		queue = l.QueueFor(id)
	} else if q := optValue(opts, asynq.QueueOpt); q != "" {
		queue = q
	}
	// Within the previous layout's retention the id may be there already:
	// re-enqueuing it must stay a no-op.
	if pq, ok := l.prevQueueFor(id, time.Now()); ok && id != "" {
		found, err := c.existing(pq, id, j)
		if err != nil {
			return "", err
		}
		if found {
			return id, nil
		}
	}
	all := append([]asynq.Option{
		asynq.Queue(queue),
		asynq.Retention(c.retention),
		asynq.MaxRetry(c.maxRetry),
		asynq.Timeout(c.timeout),
	}, opts...)
	info, err := c.c.EnqueueContext(ctx, asynq.NewTask(TaskType, payload), all...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		id, queue := optValue(all, asynq.TaskIDOpt), optValue(all, asynq.QueueOpt)
		if _, err := c.existing(queue, id, j); err != nil {
			return "", err
		}
		return id, nil
	}
	if err != nil {
		return "", fmt.Errorf("enqueue to queue %q: %w", queue, err)
	}
	return info.ID, nil
}

// ErrIDReused is returned by Enqueue when the caller's task id is already
// taken by a different job: the enqueue is not a retry of the earlier one.
var ErrIDReused = errors.New("task id already used by a different job")

// existing checks that the task stored under id in queue, if any, is the
// job j (its inputs, output, eps, outputs, grad_dtype and w pin; the enqueue time and
// signature may differ), so that a retried enqueue is a no-op but reusing
// an id for another job is an error rather than a silently lost job. found
// is false when queue holds no such task (after a conflict: its retention
// just ended, which counts as the same job).
func (c *Client) existing(queue, id string, j Job) (found bool, err error) {
	info, err := c.insp.GetTaskInfo(queue, id)
	if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("job %s: already enqueued; reading it back: %w", id, err)
	}
	var prev Job
	if err := json.Unmarshal(info.Payload, &prev); err != nil {
		return true, fmt.Errorf("job %s in queue %q: %w (the stored task is not an rmsgrad job)", id, queue, ErrIDReused)
	}
	if info.Type != TaskType || prev.X != j.X || prev.W != j.W || prev.DY != j.DY || prev.Out != j.Out ||
		prev.Eps != j.Eps || !slices.Equal(prev.WantOutputs(), j.WantOutputs()) ||
		prev.GradDType != j.GradDType || prev.WSHA256 != j.WSHA256 {
		return true, fmt.Errorf("job %s in queue %q: %w (stored: x %s, out %s)", id, queue, ErrIDReused, prev.X, prev.Out)
	}
	return true, nil
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

// Ping checks that Redis answers within ctx (on a Cluster: one node).
func (c *Client) Ping(ctx context.Context) error {
	if err := pingWithin(ctx, c.rdb); err != nil {
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

// Status returns the job's current state. The job is found from its id
// alone: its shard under the current layout, else (within the previous
// layout's retention) under the previous one.
func (c *Client) Status(ctx context.Context, id string) (*Status, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l, err := c.Layout(ctx)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", id, err)
	}
	queue := l.QueueFor(id)
	info, err := c.insp.GetTaskInfo(queue, id)
	if pq, ok := l.prevQueueFor(id, time.Now()); ok && isNotFound(err) {
		queue = pq
		info, err = c.insp.GetTaskInfo(queue, id)
	}
	if isNotFound(err) {
		return nil, fmt.Errorf("job %s in queue %q: %w", id, queue, ErrJobNotFound)
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

func isNotFound(err error) bool {
	return errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound)
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
