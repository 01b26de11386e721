package rediscluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/internal/testenv"
)

// TestClusterFailover starts 3 masters with a replica each, kills the
// master of one slot and waits for its replica to serve it.
func TestClusterFailover(t *testing.T) {
	c := testenv.RedisCluster(t, 3, 1)
	ctx := context.Background()
	top, err := c.Topology(ctx)
	if err != nil {
		t.Fatal(err)
	}
	masters, replicas := 0, 0
	for _, n := range top {
		if n.Master {
			masters++
		} else {
			replicas++
		}
	}
	if masters != 3 || replicas != 3 {
		t.Fatalf("topology: %d masters, %d replicas, want 3 and 3: %+v", masters, replicas, top)
	}
	m, err := c.MasterOf(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := c.ReplicasOf(ctx, m.Addr)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replicas of %s: %v %v", m.Addr, reps, err)
	}
	start := time.Now()
	m.Kill()
	nm, err := c.WaitPromoted(ctx, m.Addr, 100, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if nm.Addr != reps[0].Addr {
		t.Fatalf("slot 100 now on %s, want the replica %s", nm.Addr, reps[0].Addr)
	}
	t.Logf("failover took %v", time.Since(start))
}
