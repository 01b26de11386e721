package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Cluster probe timing: each node is pinged with its own deadline, shorter
// than the prober's, so that a node that does not answer is named rather
// than timing out the whole check.
const clusterNodeTimeout = time.Second

// clusterProbe checks a Redis Cluster for readiness: it asks the seed
// nodes (then the nodes it learnt of) for CLUSTER SLOTS and pings every
// master that serves slots; an error names each master that did not
// answer and the slots it holds, or says the cluster itself is not ok.
// Replicas are not required: the shards are served without them.
type clusterProbe struct {
	opt asynq.RedisClusterClientOpt

	mu    sync.Mutex
	known []string                 // seeds, then nodes learnt from CLUSTER SLOTS
	conns map[string]*redis.Client // one connection per node
}

func newClusterProbe(opt asynq.RedisClusterClientOpt) *clusterProbe {
	return &clusterProbe{opt: opt, known: append([]string(nil), opt.Addrs...), conns: map[string]*redis.Client{}}
}

func (p *clusterProbe) conn(addr string) *redis.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.conns[addr]
	if !ok {
		var tc *tls.Config
		if p.opt.TLSConfig != nil {
			tc = p.opt.TLSConfig.Clone()
		}
		c = redis.NewClient(&redis.Options{Addr: addr, Username: p.opt.Username, Password: p.opt.Password, TLSConfig: tc,
			DialTimeout: clusterNodeTimeout, ReadTimeout: clusterNodeTimeout, WriteTimeout: clusterNodeTimeout,
			PoolTimeout: clusterNodeTimeout, MaxRetries: -1, DialerRetries: 1, PoolSize: 4})
		p.conns[addr] = c
	}
	return c
}

// Close closes the probe's connections.
func (p *clusterProbe) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// check is the readiness check of the "redis" dependency.
func (p *clusterProbe) check(ctx context.Context) error {
	slots, from, err := p.slots(ctx)
	if err != nil {
		return err
	}
	if info, err := p.conn(from).ClusterInfo(ctx).Result(); err == nil && !strings.Contains(info, "cluster_state:ok") {
		state := "not ok"
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cluster_state:"); ok {
				state = v
			}
		}
		return fmt.Errorf("redis cluster: state %s (as %s sees it)", state, from)
	}
	masters := map[string][]string{} // addr -> slot ranges
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			continue
		}
		a := s.Nodes[0].Addr
		masters[a] = append(masters[a], fmt.Sprintf("%d-%d", s.Start, s.End))
	}
	var mu sync.Mutex
	var down []string
	var wg sync.WaitGroup
	for addr, ranges := range masters {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, clusterNodeTimeout)
			defer cancel()
			if err := p.conn(addr).Ping(cctx).Err(); err != nil {
				var ne net.Error
				if cctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
					err = fmt.Errorf("no answer within %v", clusterNodeTimeout)
				}
				mu.Lock()
				down = append(down, fmt.Sprintf("node %s (master of slots %s): %v", addr, strings.Join(ranges, ","), err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(down) > 0 {
		sort.Strings(down)
		return fmt.Errorf("redis cluster: %s", strings.Join(down, "; "))
	}
	return nil
}

// slots asks every known node at once for CLUSTER SLOTS and takes the
// first answer, so that nodes that are down cost nothing; it remembers the
// nodes the answer lists, so that the probe still finds the cluster when
// its seeds are down.
func (p *clusterProbe) slots(ctx context.Context) ([]redis.ClusterSlot, string, error) {
	p.mu.Lock()
	known := append([]string(nil), p.known...)
	p.mu.Unlock()
	type answer struct {
		addr  string
		slots []redis.ClusterSlot
		err   error
	}
	cctx, cancel := context.WithTimeout(ctx, clusterNodeTimeout)
	defer cancel()
	ch := make(chan answer, len(known))
	for _, addr := range known {
		go func() {
			s, err := p.conn(addr).ClusterSlots(cctx).Result()
			ch <- answer{addr, s, err}
		}()
	}
	var errs []string
	for range known {
		a := <-ch
		if a.err == nil {
			p.learn(a.slots)
			return a.slots, a.addr, nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", a.addr, a.err))
	}
	sort.Strings(errs)
	return nil, "", fmt.Errorf("redis cluster: no node answered CLUSTER SLOTS: %s", strings.Join(errs, "; "))
}

// learn adds the nodes slots names to the known ones.
func (p *clusterProbe) learn(slots []redis.ClusterSlot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]bool{}
	for _, a := range p.known {
		seen[a] = true
	}
	for _, s := range slots {
		for _, n := range s.Nodes {
			if !seen[n.Addr] {
				seen[n.Addr] = true
				p.known = append(p.known, n.Addr)
			}
		}
	}
}
