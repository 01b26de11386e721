package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// cmdStat is one command's calls and time in redis-server, from INFO
// commandstats.
type cmdStat struct {
	Calls int64
	Usec  int64
}

// cmdStats reads INFO commandstats: per command, its calls and the
// microseconds redis-server spent in them since it started. Commands a
// Lua script calls count as themselves too, so evalsha's time holds
// theirs.
func (q queueCounter) cmdStats(ctx context.Context) (map[string]cmdStat, error) {
	s, err := q.c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("redis INFO commandstats: %w", err)
	}
	return parseCmdStats(s), nil
}

// parseCmdStats parses INFO commandstats lines such as
// cmdstat_evalsha:calls=12,usec=345,usec_per_call=28.75,rejected_calls=0,failed_calls=0
func parseCmdStats(s string) map[string]cmdStat {
	m := map[string]cmdStat{}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			switch k {
			case "calls":
				st.Calls = n
			case "usec":
				st.Usec = n
			}
		}
		m[name] = st
	}
	return m
}

// cmdStatsSince is b minus a, per command (commands with no new calls left
// out).
func cmdStatsSince(a, b map[string]cmdStat) map[string]cmdStat {
	d := map[string]cmdStat{}
	for k, v := range b {
		if dv := (cmdStat{v.Calls - a[k].Calls, v.Usec - a[k].Usec}); dv.Calls > 0 {
			d[k] = dv
		}
	}
	return d
}

// redisFigure sums per-job Redis work over runs (each run's commands
// divided by its jobs, summed over the runs, then divided by their count:
// the mean a job over the runs) and writes the top commands by time: calls
// and microseconds a job, and the totals.
func redisFigure(runs []map[string]cmdStat, jobs []int, top int) string {
	type agg struct {
		name        string
		calls, usec float64
	}
	sum := map[string]*agg{}
	for i, r := range runs {
		for k, v := range r {
			a := sum[k]
			if a == nil {
				a = &agg{name: k}
				sum[k] = a
			}
			a.calls += float64(v.Calls) / float64(jobs[i]) / float64(len(runs))
			a.usec += float64(v.Usec) / float64(jobs[i]) / float64(len(runs))
		}
	}
	var all []*agg
	var calls, usec float64
	for _, a := range sum {
		all = append(all, a)
		calls += a.calls
		usec += a.usec
	}
	slices.SortFunc(all, func(x, y *agg) int {
		if x.usec != y.usec {
			if x.usec > y.usec {
				return -1
			}
			return 1
		}
		return strings.Compare(x.name, y.name)
	})
	var parts []string
	for i, a := range all {
		if i == top {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.2f (%.1f us)", a.name, a.calls, a.usec))
	}
	return fmt.Sprintf("%s; in all %.1f calls, %.0f us a job", strings.Join(parts, ", "), calls, usec)
}

// queueCounter reads a queue's completed, retry and archived counts with
// three ZCARDs in one round trip. The bench polls it every 10 ms while a
// run drains: asynq's Inspector.GetQueueInfo would run two Lua scripts a
// poll, one of which samples MEMORY USAGE of up to a hundred keys, work in
// the single-threaded redis-server that the worker's own round trips would
// queue behind. The keys are asynq's (internal/base: asynq:{queue}:...);
// TestQueueCounter checks them against the Inspector.
type queueCounter struct {
	c *redis.Client
}

func newQueueCounter(addr string) queueCounter {
	return queueCounter{c: redis.NewClient(&redis.Options{Addr: addr})}
}

func (q queueCounter) Close() error { return q.c.Close() }

func (q queueCounter) counts(ctx context.Context, queue string) (completed, retry, archived int64, err error) {
	p := "asynq:{" + queue + "}:"
	var cs [3]*redis.IntCmd
	_, err = q.c.Pipelined(ctx, func(pp redis.Pipeliner) error {
		for i, k := range []string{"completed", "retry", "archived"} {
			cs[i] = pp.ZCard(ctx, p+k)
		}
		return nil
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("queue %s counts: %w", queue, err)
	}
	return cs[0].Val(), cs[1].Val(), cs[2].Val(), nil
}
