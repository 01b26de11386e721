package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// TestClusterConfig: redis.cluster_addrs, RMSGRAD_REDIS_CLUSTER_ADDRS and
// --redis-cluster (in rising precedence) make a Cluster connection with
// the ACL user, password and TLS of the other keys; shards likewise.
func TestClusterConfig(t *testing.T) {
	clearEnv(t)
	t.Setenv("RMSGRAD_REDIS_CLUSTER_ADDRS", "")
	t.Setenv("RMSGRAD_SHARDS", "")
	dir := t.TempDir()
	path := filepath.Join(dir, "enqueue.yaml")
	writeFile(t, path, "redis:\n  cluster_addrs: [f1:7000, f2:7001]\n  username: u\n  tls: true\nshards: 3\n")
	t.Setenv("RMSGRAD_REDIS_PASSWORD", "pw")

	c, err := parseConn(t, "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	opt, err := c.redisOpt()
	if err != nil {
		t.Fatal(err)
	}
	co, ok := opt.(jobs.ClusterOpt)
	if !ok || !slices.Equal(co.Addrs, []string{"f1:7000", "f2:7001"}) || co.Username != "u" || co.Password != "pw" || co.TLSConfig == nil {
		t.Fatalf("redis option %#v: want a TLS cluster of f1, f2 as u", opt)
	}
	if c.Shards != 3 || c.redisFrom != "redis.cluster_addrs in "+path || c.redisShown() != "cluster f1:7000,f2:7001" {
		t.Fatalf("shards %d, from %q, shown %q", c.Shards, c.redisFrom, c.redisShown())
	}

	t.Setenv("RMSGRAD_REDIS_CLUSTER_ADDRS", "e1:1, e2:2")
	t.Setenv("RMSGRAD_SHARDS", "2")
	c, err = parseConn(t, "--config", path)
	if err != nil || !slices.Equal(c.Redis.ClusterAddrs, []string{"e1:1", "e2:2"}) || c.Shards != 2 || c.redisFrom != "env RMSGRAD_REDIS_CLUSTER_ADDRS" {
		t.Fatalf("env: %+v shards %d from %q: %v", c.Redis, c.Shards, c.redisFrom, err)
	}
	c, err = parseConn(t, "--config", path, "--redis-cluster", "g1:1", "--shards", "0")
	if err != nil || !slices.Equal(c.Redis.ClusterAddrs, []string{"g1:1"}) || c.Shards != 0 || c.redisFrom != "flag --redis-cluster" {
		t.Fatalf("flags: %+v shards %d from %q: %v", c.Redis, c.Shards, c.redisFrom, err)
	}

	for _, bad := range []struct{ yaml, want string }{
		{"redis:\n  cluster_addrs: [a:1]\n  db: 1\n", "only database 0"},
		{"shards: -2\n", "shards: must be >= 0"},
		{"queue: \"a{b}\"\n", "contains a brace"},
	} {
		t.Setenv("RMSGRAD_REDIS_CLUSTER_ADDRS", "")
		t.Setenv("RMSGRAD_SHARDS", "")
		writeFile(t, path, bad.yaml)
		if _, err := parseConn(t, "--config", path); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want %q", bad.yaml, err, bad.want)
		}
	}
	t.Setenv("RMSGRAD_SHARDS", "three")
	if _, err := parseConn(t); err == nil || !strings.Contains(err.Error(), "RMSGRAD_SHARDS") {
		t.Errorf("RMSGRAD_SHARDS=three: %v", err)
	}
}
