package testenv

import (
	"context"
	"testing"

	"github.com/rmsgrad/rmsgrad/internal/rediscluster"
)

// RedisCluster starts a real Redis Cluster of masters masters, each with
// replicas replicas (redis-server --cluster-enabled yes on free loopback
// ports, joined with redis-cli --cluster create), with a 2 s
// cluster-node-timeout, and stops it when the test ends. redis-cli comes
// from $RMSGRAD_REDIS_CLI, else PATH (Debian's redis-tools, which
// redis-server depends on).
func RedisCluster(t testing.TB, masters, replicas int, extra ...string) *rediscluster.Cluster {
	t.Helper()
	srv := Binary(t, "RMSGRAD_REDIS_SERVER", "redis-server")
	cli := Binary(t, "RMSGRAD_REDIS_CLI", "redis-cli")
	c, err := rediscluster.Start(context.Background(), rediscluster.Options{
		Server: srv, CLI: cli, Dir: t.TempDir(), Masters: masters, Replicas: replicas, Extra: extra})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}
