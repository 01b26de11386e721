package jobs

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sharded queues. A logical queue (rmsnorm) is spread over N asynq queues,
// its shards. asynq puts every key of a queue under the hash tag {queue},
// so on a Redis Cluster one queue lives in one hash slot on one node, and
// shards whose names hash to slots of different masters spread the load
// over them. With N = 1 the one shard is the logical queue itself: the wire
// format of an unsharded deployment.
//
// A job's shard is a function of its task id alone (ShardOf), so a client
// finds a job from its id and re-enqueuing an id lands on the same shard,
// where asynq's task-id check makes it a no-op.
//
// N is recorded in Redis per logical queue (LayoutKey), so every client and
// worker uses the same N; no record means N = 1. Only a reshard changes it
// (Client.Reshard, `enqueue reshard`), which first stops enqueues and
// waits until the old shards are drained.

// Hash-slot geometry of Redis Cluster.
const numSlots = 16384

// MaxShards bounds a queue's shard count: Redis Cluster is meant for up to
// about a thousand masters, and ShardName needs a few slots per shard.
const MaxShards = 1024

// LayoutRefresh is how often clients and workers re-read a queue's layout
// record; LayoutMaxAge is how long they keep using the last one they read
// when Redis does not answer (past it, a client refuses to enqueue). A
// reshard waits LayoutMaxAge + LayoutRefresh after stopping enqueues, so
// that every client has seen the stop before it checks the old shards are
// drained.
const (
	LayoutRefresh = 5 * time.Second
	LayoutMaxAge  = 60 * time.Second
)

// ShardOf returns the shard (0..n-1) of a task id: FNV-1a (32 bit) of the
// id's bytes, modulo n. It is part of the wire format: every client of a
// sharded queue must compute it the same way.
func ShardOf(id string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// ShardName returns the asynq queue name of shard i of n of the logical
// queue. With n = 1 it is queue itself. Otherwise it is queue.i, or
// queue.i.k with the smallest k >= 1 that makes it fit: the name whose hash
// slot lies in the middle half of the i-th of n equal slot ranges. A
// cluster whose masters own equal contiguous ranges (what redis-cli
// --cluster create and rebalance make) then has the shards of n = its
// master count on distinct masters, and those of a multiple of it spread
// evenly. `enqueue shards` prints where each shard landed.
func ShardName(queue string, n, i int) string {
	if n <= 1 {
		return queue
	}
	key := shardKey{queue, n, i}
	if v, ok := shardNames.Load(key); ok {
		return v.(string)
	}
	n = min(n, MaxShards)
	w := numSlots / n
	lo := i*numSlots/n + w/4
	hi := lo + w/2
	base := queue + "." + strconv.Itoa(i)
	name := base
	for k := 1; ; k++ {
		if s := QueueSlot(name); s >= lo && s < hi {
			break
		}
		name = base + "." + strconv.Itoa(k)
	}
	shardNames.Store(key, name)
	return name
}

type shardKey struct {
	q    string
	n, i int
}

var shardNames sync.Map // shardKey -> string

// ShardNames returns the n shard names of queue, shard 0 first.
func ShardNames(queue string, n int) []string {
	out := make([]string, max(n, 1))
	for i := range out {
		out[i] = ShardName(queue, n, i)
	}
	return out
}

// QueueSlot returns the Redis Cluster hash slot that asynq's keys of queue
// q live in (all of them share the hash tag {q}).
func QueueSlot(q string) int { return KeySlot("asynq:{" + q + "}:pending") }

// KeySlot returns a key's Redis Cluster hash slot: CRC16 (XMODEM) of its
// hash tag (the part between the first { and the next }, when not empty),
// else of the whole key, modulo 16384.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key)) % numSlots
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), Redis
// Cluster's key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// ValidateQueueName checks a logical queue name: not empty, and no braces
// (asynq puts the name inside a {hash tag}; a brace in it would cut the tag
// and scatter the queue's keys over slots).
func ValidateQueueName(q string) error {
	if strings.TrimSpace(q) == "" {
		return errors.New("queue name is empty")
	}
	if strings.ContainsAny(q, "{}") {
		return fmt.Errorf("queue name %q contains a brace (asynq uses {queue} as the Redis Cluster hash tag)", q)
	}
	return nil
}

// Layout is how a logical queue is spread over asynq queues now, as
// recorded in Redis.
type Layout struct {
	Queue  string // the logical queue
	Shards int    // N >= 1
	// Prev is N before the last reshard and PrevUntil how long its shards
	// still matter: until then completed jobs of the old layout keep their
	// results there (Status looks there too, and re-enqueuing such an id is
	// still a no-op) and workers keep serving the old shards, so that
	// asynq's janitor deletes their expired results. 0 when none.
	Prev      int
	PrevUntil time.Time
	// To is the N a reshard in progress moves to; 0 when none. While it is
	// set, enqueues are refused (ErrResharding) and workers drain the
	// current shards.
	To int
}

// Queues returns the current shards' asynq queue names.
func (l Layout) Queues() []string { return ShardNames(l.Queue, l.Shards) }

// QueueFor returns the asynq queue of task id under the current layout.
func (l Layout) QueueFor(id string) string {
	return ShardName(l.Queue, l.Shards, ShardOf(id, l.Shards))
}

// prevQueueFor returns the queue id had under the previous layout, while
// that layout still matters at now.
func (l Layout) prevQueueFor(id string, now time.Time) (string, bool) {
	if l.Prev == 0 || !now.Before(l.PrevUntil) {
		return "", false
	}
	q := ShardName(l.Queue, l.Prev, ShardOf(id, l.Prev))
	return q, q != l.QueueFor(id)
}

// Served returns the asynq queues workers serve: the current shards, then
// the previous layout's while it still matters at now (nothing new is
// enqueued there; their completed results expire through the janitor of
// the servers that serve them).
func (l Layout) Served(now time.Time) []string {
	qs := l.Queues()
	if l.Prev > 0 && now.Before(l.PrevUntil) {
		for _, q := range ShardNames(l.Queue, l.Prev) {
			if !contains(qs, q) {
				qs = append(qs, q)
			}
		}
	}
	return qs
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func (l Layout) String() string {
	s := fmt.Sprintf("queue %q: %d shard(s)", l.Queue, l.Shards)
	if l.To != 0 {
		s += fmt.Sprintf(", resharding to %d", l.To)
	}
	if l.Prev != 0 {
		s += fmt.Sprintf(", previously %d until %s", l.Prev, l.PrevUntil.UTC().Format(time.RFC3339))
	}
	return s
}

// LayoutKey is the Redis hash holding a logical queue's layout: fields
// shards, prev, prev_until (Unix seconds) and to. It lives among asynq's
// keys of the unsharded queue (hash tag {queue}, prefix asynq:), so that an
// ACL user limited to asynq's keys (~asynq:*) reads it too.
func LayoutKey(queue string) string { return "asynq:{" + queue + "}:rmsgrad-layout" }

// ReadLayout reads queue's layout record; no record is one shard.
func ReadLayout(ctx context.Context, rdb redis.UniversalClient, queue string) (Layout, error) {
	m, err := rdb.HGetAll(ctx, LayoutKey(queue)).Result()
	if err != nil {
		return Layout{}, fmt.Errorf("queue %q: read layout %s: %w", queue, LayoutKey(queue), err)
	}
	l := Layout{Queue: queue, Shards: 1}
	num := func(field string) (int64, error) {
		v, ok := m[field]
		if !ok {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("queue %q: layout %s: field %s is %q, not a count", queue, LayoutKey(queue), field, v)
		}
		return n, nil
	}
	var n int64
	if n, err = num("shards"); err != nil {
		return l, err
	} else if n > MaxShards {
		return l, fmt.Errorf("queue %q: layout %s: %d shards, more than %d", queue, LayoutKey(queue), n, MaxShards)
	} else if n > 0 {
		l.Shards = int(n)
	}
	if n, err = num("prev"); err != nil {
		return l, err
	}
	l.Prev = int(n)
	if n, err = num("prev_until"); err != nil {
		return l, err
	}
	if n > 0 {
		l.PrevUntil = time.Unix(n, 0)
	}
	if n, err = num("to"); err != nil {
		return l, err
	}
	l.To = int(n)
	return l, nil
}

// ErrResharding is returned by Enqueue while a reshard of the queue is in
// progress: the enqueue is safe to retry once it has finished.
var ErrResharding = errors.New("queue is being resharded")

// ErrLayoutMismatch is returned when a client or worker is configured for
// a number of shards other than the one recorded in Redis.
var ErrLayoutMismatch = errors.New("shard count differs from the one recorded in Redis")

// checkShards compares a configured shard count (0: follow Redis) with the
// recorded layout.
func checkShards(l Layout, want int) error {
	if want == 0 || want == l.Shards {
		return nil
	}
	how := fmt.Sprintf("set shards to %d (or to 0, to follow Redis)", l.Shards)
	if l.To == want {
		how = fmt.Sprintf("a reshard to %d is in progress; wait for it to finish", want)
	} else {
		how += fmt.Sprintf(", or move the queue to %d shards with 'enqueue reshard --to %d'", want, want)
	}
	return fmt.Errorf("queue %q: configured for %d shards, Redis records %d (%s): %w; %s",
		l.Queue, want, l.Shards, LayoutKey(l.Queue), ErrLayoutMismatch, how)
}

// layoutCache keeps the last layout read, refreshed every LayoutRefresh.
type layoutCache struct {
	rdb   redis.UniversalClient
	queue string

	mu  sync.Mutex
	l   Layout
	at  time.Time // when l was read; zero: never
	err error     // the last refresh's error
}

// get returns the layout, re-reading it when older than LayoutRefresh; if
// that fails it keeps the last one for up to LayoutMaxAge.
func (c *layoutCache) get(ctx context.Context) (Layout, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < LayoutRefresh {
		return c.l, nil
	}
	l, err := ReadLayout(ctx, c.rdb, c.queue)
	if err == nil {
		c.l, c.at, c.err = l, time.Now(), nil
		return l, nil
	}
	c.err = err
	if !c.at.IsZero() && time.Since(c.at) < LayoutMaxAge {
		return c.l, nil
	}
	return Layout{}, err
}

// invalidate makes the next get re-read the record.
func (c *layoutCache) invalidate() {
	c.mu.Lock()
	c.at = time.Time{}
	c.mu.Unlock()
}
