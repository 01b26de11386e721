package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// ReshardOptions tune Client.Reshard. Zero fields take the values noted.
type ReshardOptions struct {
	// Settle is how long enqueues stay stopped before the drain check, so
	// that every client has seen the stop (default LayoutMaxAge +
	// LayoutRefresh). Shorten it only when no other client is running.
	Settle time.Duration
	// Drain bounds the wait for the old shards to empty (default 10 min).
	// When it runs out nothing changes and enqueues resume.
	Drain time.Duration
	// Retention is how long the old shards' completed results stay
	// findable by id afterwards; the largest retention any client sets
	// (default DefaultRetention).
	Retention time.Duration
	// Poll is the interval of the drain check (default 1 s).
	Poll time.Duration
	// Progress, when set, is told what the reshard is waiting for.
	Progress func(msg string)
}

// ErrNotDrained is returned by Reshard when the old shards still hold work
// at the end of the drain wait; the layout is left as it was.
var ErrNotDrained = errors.New("old shards not drained")

// Reshard moves the queue to n shards. Changing N changes the shard of most
// task ids, so jobs queued under the old N would sit where no client looks
// and (once workers follow the new N) no worker serves. So Reshard:
//
//  1. records To = n: clients refuse to enqueue (ErrResharding) while
//     workers keep serving the old shards;
//  2. waits Settle, so that every client has seen it;
//  3. waits until every old shard is drained: nothing pending, active,
//     scheduled, waiting to retry or aggregating (completed and archived
//     tasks stay);
//  4. records shards = n, prev = the old N, prev_until = now + Retention,
//     and clears To: clients enqueue to the new shards and find older
//     results in the old ones; workers serve both until prev_until, so
//     asynq's janitor deletes the old results as they expire.
//
// If the drain does not finish within Drain, or ctx ends first, Reshard
// clears To and returns an error saying what was still queued; nothing has
// changed. A Reshard to the N a reshard in progress is moving to (one that
// died) takes it over.
func (c *Client) Reshard(ctx context.Context, n int, o ReshardOptions) (Layout, error) {
	if n < 1 || n > MaxShards {
		return Layout{}, fmt.Errorf("reshard queue %q: shards must be in 1..%d, got %d", c.queue, MaxShards, n)
	}
	if o.Settle == 0 {
		o.Settle = LayoutMaxAge + LayoutRefresh
	}
	if o.Drain == 0 {
		o.Drain = 10 * time.Minute
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	say := func(format string, args ...any) {
		if o.Progress != nil {
			o.Progress(fmt.Sprintf(format, args...))
		}
	}
	l, err := ReadLayout(ctx, c.rdb, c.queue)
	if err != nil {
		return l, err
	}
	if l.To == 0 && l.Shards == n {
		return l, nil
	}
	if l.To != 0 && l.To != n {
		return l, fmt.Errorf("reshard queue %q to %d: a reshard to %d is in progress (or died: finish it with --to %d, or cancel it with --abort)",
			c.queue, n, l.To, l.To)
	}
	if l.Prev != 0 && time.Now().Before(l.PrevUntil) {
		say("warning: the layout before this one (%d shards) still holds results until %s; after this reshard they can no longer be found by id",
			l.Prev, l.PrevUntil.UTC().Format(time.RFC3339))
	}
	if err := freezeScript.Run(ctx, c.rdb, []string{LayoutKey(c.queue)}, n, l.Shards).Err(); err != nil {
		return l, fmt.Errorf("reshard queue %q: stop enqueues: %w", c.queue, err)
	}
	l.To = n
	abort := func(cause error) (Layout, error) {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := c.rdb.HDel(actx, LayoutKey(c.queue), "to").Err(); err != nil {
			return l, fmt.Errorf("%w; and resuming enqueues failed too (run 'enqueue reshard --abort'): %v", cause, err)
		}
		return l, fmt.Errorf("%w; nothing changed, enqueues resumed", cause)
	}
	say("enqueues to %q stopped; waiting %v for every client to see it", c.queue, o.Settle)
	if err := sleepCtx(ctx, o.Settle); err != nil {
		return abort(fmt.Errorf("reshard queue %q: %w", c.queue, err))
	}
	deadline := time.Now().Add(o.Drain)
	for {
		left, err := c.undrained(l)
		if err == nil && left == "" {
			break
		}
		if err != nil {
			left = err.Error()
		}
		if time.Now().After(deadline) {
			return abort(fmt.Errorf("reshard queue %q: %w after %v: %s", c.queue, ErrNotDrained, o.Drain, left))
		}
		say("waiting for workers to drain: %s", left)
		if err := sleepCtx(ctx, o.Poll); err != nil {
			return abort(fmt.Errorf("reshard queue %q: %w (still queued: %s)", c.queue, err, left))
		}
	}
	until := time.Now().Add(o.Retention)
	if err := flipScript.Run(ctx, c.rdb, []string{LayoutKey(c.queue)}, n, l.Shards, until.Unix()).Err(); err != nil {
		return abort(fmt.Errorf("reshard queue %q: record the new layout: %w", c.queue, err))
	}
	c.layout.invalidate()
	return ReadLayout(ctx, c.rdb, c.queue)
}

// AbortReshard clears a reshard in progress (one whose command died):
// enqueues resume under the current layout.
func (c *Client) AbortReshard(ctx context.Context) error {
	if err := c.rdb.HDel(ctx, LayoutKey(c.queue), "to").Err(); err != nil {
		return fmt.Errorf("queue %q: abort reshard: %w", c.queue, err)
	}
	c.layout.invalidate()
	return nil
}

// undrained describes what the current shards still hold that a worker
// has to run, or "" when nothing.
func (c *Client) undrained(l Layout) (string, error) {
	var left []string
	for _, q := range l.Queues() {
		info, err := c.queueInfo(q)
		if err != nil {
			return "", fmt.Errorf("shard %s: %w", q, err)
		}
		if info == nil {
			continue
		}
		if n := info.Pending + info.Active + info.Scheduled + info.Retry + info.Aggregating; n > 0 {
			left = append(left, fmt.Sprintf("%s: %d pending, %d active, %d scheduled, %d retry, %d aggregating",
				q, info.Pending, info.Active, info.Scheduled, info.Retry, info.Aggregating))
		}
	}
	return strings.Join(left, "; "), nil
}

// queueInfo returns asynq's counts of queue q, or nil when the queue does
// not exist (nothing was ever enqueued to it). asynq's GetQueueInfo does
// not map its not-found error to ErrQueueNotFound, so the queue registry
// is asked first.
func (c *Client) queueInfo(q string) (*asynq.QueueInfo, error) {
	qs, err := c.insp.Queues()
	if err != nil {
		return nil, err
	}
	if !slices.Contains(qs, q) {
		return nil, nil
	}
	return c.insp.GetQueueInfo(q)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// freezeScript sets to = ARGV[1] when the layout still has ARGV[2] shards
// and no other reshard is in progress.
//
// KEYS[1] layout key; ARGV[1] new N; ARGV[2] the N read before.
var freezeScript = redis.NewScript(`
local cur = tonumber(redis.call("HGET", KEYS[1], "shards") or "1")
local to = redis.call("HGET", KEYS[1], "to")
if to and to ~= ARGV[1] then
  return redis.error_reply("another reshard (to " .. to .. ") started meanwhile")
end
if cur ~= tonumber(ARGV[2]) then
  return redis.error_reply("the layout changed meanwhile (now " .. cur .. " shards)")
end
redis.call("HSET", KEYS[1], "to", ARGV[1])
return 1`)

// flipScript records the new layout if this reshard still owns it.
//
// KEYS[1] layout key; ARGV[1] new N; ARGV[2] old N; ARGV[3] prev_until.
var flipScript = redis.NewScript(`
if redis.call("HGET", KEYS[1], "to") ~= ARGV[1] then
  return redis.error_reply("the reshard was aborted meanwhile")
end
redis.call("HSET", KEYS[1], "shards", ARGV[1], "prev", ARGV[2], "prev_until", ARGV[3])
redis.call("HDEL", KEYS[1], "to")
return 1`)

// ShardInfo describes one shard of a queue: its asynq queue, hash slot,
// the Cluster node serving it as master ("" when Redis is not a Cluster)
// and its task counts.
type ShardInfo struct {
	Index     int    `json:"index"`
	Queue     string `json:"queue"`
	Slot      int    `json:"slot"`
	Node      string `json:"node,omitempty"`
	Pending   int    `json:"pending"`
	Active    int    `json:"active"`
	Scheduled int    `json:"scheduled"`
	Retry     int    `json:"retry"`
	Archived  int    `json:"archived"`
	Completed int    `json:"completed"`
}

// Shards returns the queue's layout and a description of each current
// shard.
func (c *Client) Shards(ctx context.Context) (Layout, []ShardInfo, error) {
	l, err := ReadLayout(ctx, c.rdb, c.queue)
	if err != nil {
		return l, nil, err
	}
	_, cluster := c.rdb.(*redis.ClusterClient)
	var out []ShardInfo
	for i, q := range l.Queues() {
		si := ShardInfo{Index: i, Queue: q, Slot: QueueSlot(q)}
		if cluster {
			nodes, err := c.insp.ClusterNodes(q)
			if err != nil {
				return l, nil, fmt.Errorf("shard %s: cluster node: %w", q, err)
			}
			if len(nodes) > 0 {
				si.Node = nodes[0].Addr
			}
		}
		info, err := c.queueInfo(q)
		if err != nil {
			return l, nil, fmt.Errorf("shard %s: %w", q, err)
		}
		if info != nil {
			si.Pending, si.Active, si.Scheduled, si.Retry, si.Archived, si.Completed =
				info.Pending, info.Active, info.Scheduled, info.Retry, info.Archived, info.Completed
		}
		out = append(out, si)
	}
	return l, out, nil
}
