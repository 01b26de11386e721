package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// ServersConfig configures a Servers.
type ServersConfig struct {
	// Queues maps each logical queue to its priority weight.
	Queues map[string]int
	// Shards is the shard count the worker expects of every queue: when
	// Redis records another, Start fails (and, later, Err reports it and
	// the worker keeps its shards). 0 follows the record.
	Shards int
	// Fetchers is how many asynq servers serve each shard index; 0 is
	// AutoFetchLoops (8) in all (rounded up per shard). An asynq server takes
	// its tasks one at a time (one Redis round trip each,
	// processor.exec), so when a batch completes, its jobs' handler slots
	// are refilled one round trip after another; more servers on the same
	// queues fetch side by side, each with its share of the concurrency,
	// exactly as workers of a fleet do.
	Fetchers int
	// Server is the template of each asynq server: Concurrency is the
	// worker's total, split evenly over the servers; Queues is set from
	// the layouts; StrictPriority orders the logical queues within each.
	Server asynq.Config
	Logger *slog.Logger
}

// Servers runs a worker's asynq servers: one per shard index, server k
// serving shard k of every logical queue with the queue's weight. So every
// shard is served with equal weight (each has its own fetch loop), strict
// priority orders the logical queues within each server exactly as it
// does unsharded, and a Cluster node that is down stalls the fetch loop of
// its own shards only. With one shard it is one asynq server with the
// configured queues and concurrency: the unsharded worker.
//
// Servers follows the layouts recorded in Redis: it re-reads them every
// LayoutRefresh and, after a reshard, serves the new shards and the old
// ones until their results expire.
type Servers struct {
	rdb redis.UniversalClient
	cfg ServersConfig
	log *slog.Logger

	mu      sync.Mutex
	h       asynq.Handler
	layouts map[string]Layout
	plan    []map[string]int
	servers []*asynq.Server
	err     error
	stop    context.CancelFunc
	done    chan struct{}
}

// AutoFetchLoops is the fetch loops a worker runs in all when Fetchers is
// 0. Small jobs, 64 handlers, alternated in one run against 4 loops: on
// 16-core GPU hosts 8 loops did 1.18x and 1.03x the jobs/s on 0.91x and
// 0.96x the CPU per job (1 loop 0.72x on 1.23x, 16 loops no better than
// 8); on a 2-vCPU VM 1.06x on 0.92x (docs/operations.md).
const AutoFetchLoops = 8

// NewServers returns the servers of a worker on the Redis r describes.
func NewServers(r asynq.RedisConnOpt, cfg ServersConfig) *Servers {
	rdb, ok := r.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		panic(fmt.Sprintf("jobs: unsupported RedisConnOpt type %T", r))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Servers{rdb: rdb, cfg: cfg, log: log}
}

// Start reads the layouts, fails if one differs from the configured shard
// count, starts the servers with handler h and watches the layouts until
// Shutdown.
func (s *Servers) Start(ctx context.Context, h asynq.Handler) error {
	if len(s.cfg.Queues) == 0 {
		return errors.New("jobs: no queues to serve")
	}
	for q := range s.cfg.Queues {
		if err := ValidateQueueName(q); err != nil {
			return err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, LayoutRefresh)
	layouts, err := s.readLayouts(rctx)
	cancel()
	if err == nil {
		for _, q := range slices.Sorted(maps.Keys(layouts)) {
			if err := checkShards(layouts[q], s.cfg.Shards); err != nil {
				return err
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.h = h
	if err != nil {
		// Redis is down: serve nothing yet (the shards are unknown), and
		// start once the layouts can be read.
		s.err = fmt.Errorf("not serving yet: %w", err)
		s.log.Warn("queue layout not readable yet: no queue served until it is", "err", err)
	} else if _, err := s.apply(layouts, time.Now()); err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.stop, s.done = cancel, make(chan struct{})
	go s.watch(wctx)
	return nil
}

// Shutdown stops watching, shuts every server down (each waits for its
// active handlers up to ShutdownTimeout; see asynq.Server.Shutdown) and
// closes the Redis connections.
func (s *Servers) Shutdown() {
	if s.stop != nil {
		s.stop()
		<-s.done
	}
	s.mu.Lock()
	servers := s.servers
	s.servers = nil
	s.mu.Unlock()
	shutdownAll(servers)
	_ = s.rdb.Close()
}

// Ping checks that Redis answers (on a Cluster: one node).
// Ping checks that Redis answers within ctx.
func (s *Servers) Ping(ctx context.Context) error { return pingWithin(ctx, s.rdb) }

// pingWithin pings rdb and returns when it answers or when ctx ends,
// whichever comes first. The clients asynq makes do not set go-redis's
// ContextTimeoutEnabled, so a Redis that accepts a connection and never
// answers would hold the ping for the client's own dial and read
// timeouts (5 s here) whatever ctx says; the ping left behind ends within
// those.
func pingWithin(ctx context.Context, rdb redis.UniversalClient) error {
	done := make(chan error, 1)
	go func() { done <- rdb.Ping(ctx).Err() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer: %w", context.Cause(ctx))
	}
}

// Queues returns the asynq queues served now.
func (s *Servers) Queues() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var qs []string
	for _, m := range s.plan {
		qs = append(qs, slices.Sorted(maps.Keys(m))...)
	}
	slices.Sort(qs)
	return qs
}

// Layouts returns the layouts the servers follow now, by logical queue.
func (s *Servers) Layouts() map[string]Layout {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.layouts)
}

// Err returns why the servers do not serve what Redis records (a layout
// that differs from the configured shard count), or nil.
func (s *Servers) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Servers) readLayouts(ctx context.Context) (map[string]Layout, error) {
	out := map[string]Layout{}
	for q := range s.cfg.Queues {
		l, err := ReadLayout(ctx, s.rdb, q)
		if err != nil {
			return nil, err
		}
		out[q] = l
	}
	return out, nil
}

// watch re-reads the layouts every LayoutRefresh and re-plans the servers
// when what should be served changed.
func (s *Servers) watch(ctx context.Context) {
	defer close(s.done)
	for {
		s.mu.Lock()
		wait := LayoutRefresh
		if s.servers == nil {
			wait = time.Second // not serving yet: try again soon
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		rctx, cancel := context.WithTimeout(ctx, LayoutRefresh)
		layouts, err := s.readLayouts(rctx)
		cancel()
		if err != nil {
			s.mu.Lock()
			if s.servers == nil {
				s.err = fmt.Errorf("not serving yet: %w", err)
			}
			s.mu.Unlock()
			continue // Redis down: the readiness probe reports it; keep serving
		}
		var bad error
		for _, q := range slices.Sorted(maps.Keys(layouts)) {
			if err := checkShards(layouts[q], s.cfg.Shards); err != nil {
				bad = err
			}
		}
		s.mu.Lock()
		if bad != nil {
			if s.err == nil || s.err.Error() != bad.Error() {
				s.log.Error("queue layout changed and this worker is configured for another: it keeps serving its shards", "err", bad)
			}
			s.err = bad
			s.mu.Unlock()
			continue
		}
		s.err = nil
		old, err := s.apply(layouts, time.Now())
		if err != nil {
			s.log.Error("serving the new queue layout", "err", err)
		}
		s.mu.Unlock()
		shutdownAll(old) // drained: they served the old layout
	}
}

// apply starts the servers layouts call for, if they differ from the
// running ones, and returns the servers they replace, for the caller to
// shut down. Called with s.mu held.
func (s *Servers) apply(layouts map[string]Layout, now time.Time) (old []*asynq.Server, err error) {
	plan := planServers(layouts, s.cfg.Queues, now)
	if s.servers != nil && slices.EqualFunc(plan, s.plan, maps.Equal) {
		s.layouts = layouts
		return nil, nil
	}
	fetchers := s.cfg.Fetchers
	if fetchers <= 0 {
		fetchers = (AutoFetchLoops + len(plan) - 1) / len(plan)
	}
	// Every server gets at least one handler slot.
	fetchers = max(1, min(fetchers, s.cfg.Server.Concurrency/len(plan)))
	n := len(plan) * fetchers
	conc := (s.cfg.Server.Concurrency + n - 1) / n
	var started []*asynq.Server
	for _, queues := range plan {
		for range fetchers {
			c := s.cfg.Server
			c.Queues = queues
			c.Concurrency = max(conc, 1)
			srv := asynq.NewServerFromRedisClient(s.rdb, c)
			if err := srv.Start(s.h); err != nil {
				shutdownAll(started)
				return nil, fmt.Errorf("asynq server for queues %v: %w", slices.Sorted(maps.Keys(queues)), err)
			}
			started = append(started, srv)
		}
	}
	old = s.servers
	s.servers, s.plan, s.layouts = started, plan, layouts
	var served []string
	for _, m := range plan {
		served = append(served, slices.Sorted(maps.Keys(m))...)
	}
	s.log.Info("serving queues", "servers", n, "fetchers_per_shard", fetchers, "queues", served, "concurrency_each", max(conc, 1))
	return old, nil
}

func shutdownAll(servers []*asynq.Server) {
	var wg sync.WaitGroup
	for _, srv := range servers {
		wg.Go(srv.Shutdown)
	}
	wg.Wait()
}

// planServers returns the queues of each server: server k serves shard k
// of every logical queue (with the queue's weight), and shard j of a
// previous layout still served goes to server j mod the server count.
func planServers(layouts map[string]Layout, weights map[string]int, now time.Time) []map[string]int {
	n := 1
	for _, l := range layouts {
		n = max(n, l.Shards)
	}
	plan := make([]map[string]int, n)
	for k := range plan {
		plan[k] = map[string]int{}
	}
	for _, q := range slices.Sorted(maps.Keys(weights)) {
		l, ok := layouts[q]
		if !ok {
			l = Layout{Queue: q, Shards: 1}
		}
		w := weights[q]
		cur := l.Queues()
		for i, name := range cur {
			plan[i][name] = w
		}
		if l.Prev > 0 && now.Before(l.PrevUntil) {
			for j, name := range ShardNames(q, l.Prev) {
				if !contains(cur, name) {
					plan[j%n][name] = w
				}
			}
		}
	}
	return plan
}
