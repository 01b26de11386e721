package jobs

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// ClusterOpt connects to a Redis Cluster the way asynq.RedisClusterClientOpt
// does (the same go-redis ClusterClient, which asynq's cluster support runs
// on), with two changes that a master failing over needs:
//
//   - The client re-reads the cluster's slot map (CLUSTER SLOTS) as soon as
//     a command fails for a reason other than a Redis error reply, and
//     every 10 s besides. go-redis re-reads it only on a MOVED or ASK
//     reply and every 60 s, so after a replica took over from a master
//     that died or hangs, commands for its slots kept going to the old
//     master (and failing) for up to a minute.
//   - A node that hangs instead of refusing connections (a host cut off by
//     the network, a stopped process) costs at most DialRetries dials of
//     DialTimeout each: 2 of 2 s by default, where go-redis tries 5 times
//     for up to 5 s each.
type ClusterOpt struct {
	asynq.RedisClusterClientOpt
	DialRetries int
}

// MakeRedisClient implements asynq.RedisConnOpt.
func (o ClusterOpt) MakeRedisClient() any {
	dial := o.DialTimeout
	if dial == 0 {
		dial = 2 * time.Second
	}
	retries := o.DialRetries
	if retries == 0 {
		retries = 2
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                      o.Addrs,
		MaxRedirects:               o.MaxRedirects,
		Username:                   o.Username,
		Password:                   o.Password,
		DialTimeout:                dial,
		DialerRetries:              retries,
		ReadTimeout:                o.ReadTimeout,
		WriteTimeout:               o.WriteTimeout,
		TLSConfig:                  o.TLSConfig,
		ClusterStateReloadInterval: 10 * time.Second,
	})
	c.AddHook(reloadOnError{c})
	return c
}

// reloadOnError asks the cluster client to re-read the slot map (in the
// background; go-redis coalesces requests and waits 200 ms between
// reloads) after a command or pipeline fails other than with a Redis
// error reply.
type reloadOnError struct{ c *redis.ClusterClient }

func (h reloadOnError) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnError) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if topologyError(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnError) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if topologyError(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

// topologyError reports whether err may mean the slot map is stale: a
// network error or timeout, or a reply saying the cluster or a master is
// down. Other error replies (a script's "NOT FOUND", WRONGTYPE, ...) and
// redis.Nil do not.
func topologyError(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		return strings.HasPrefix(msg, "CLUSTERDOWN") || strings.HasPrefix(msg, "TRYAGAIN") || strings.HasPrefix(msg, "MASTERDOWN")
	}
	return true
}
