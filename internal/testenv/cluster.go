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
	return RedisClusterWith(t, rediscluster.Options{Masters: masters, Replicas: replicas, Extra: extra})
}

// RedisClusterWith is RedisCluster with every option (a password, TLS);
// the binaries and the data directory are filled in.
func RedisClusterWith(t testing.TB, opt rediscluster.Options) *rediscluster.Cluster {
	t.Helper()
	opt.Server = Binary(t, "RMSGRAD_REDIS_SERVER", "redis-server")
	opt.CLI = Binary(t, "RMSGRAD_REDIS_CLI", "redis-cli")
	opt.Dir = t.TempDir()
	c, err := rediscluster.Start(context.Background(), opt)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// ClusterTLS returns the TLS options of a cluster whose nodes use f's
// certificate.
func ClusterTLS(f *TLSFiles) *rediscluster.TLS {
	return &rediscluster.TLS{CertFile: f.CertFile, KeyFile: f.KeyFile, CAFile: f.CAFile, Client: f.ClientConfig()}
}
