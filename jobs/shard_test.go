package jobs

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestKeySlot(t *testing.T) {
	// CRC-16/XMODEM's check value, and the slots Redis documents.
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	for _, c := range []struct {
		key  string
		slot int
	}{
		{"foo", 12182},
		{"{user1000}.following", KeySlot("user1000")},
		{"foo{}{bar}", KeySlot("foo{}{bar}")}, // empty tag: the whole key
		{"foo{{bar}}zap", KeySlot("{bar")},
		{"asynq:{rmsnorm}:pending", KeySlot("rmsnorm")},
	} {
		if got := KeySlot(c.key); got != c.slot {
			t.Errorf("KeySlot(%q) = %d, want %d", c.key, got, c.slot)
		}
	}
	if KeySlot("foo{}{bar}") != int(crc16("foo{}{bar}"))%numSlots {
		t.Error("an empty hash tag must hash the whole key")
	}
}

func TestShardNames(t *testing.T) {
	if got := ShardName("rmsnorm", 1, 0); got != "rmsnorm" {
		t.Fatalf("one shard is %q, want the queue itself", got)
	}
	for n := 2; n <= 12; n++ {
		names := ShardNames("rmsnorm", n)
		seen := map[string]bool{}
		for i, q := range names {
			if seen[q] {
				t.Fatalf("n=%d: shard name %q twice", n, q)
			}
			seen[q] = true
			w := numSlots / n
			lo := i*numSlots/n + w/4
			if s := QueueSlot(q); s < lo || s >= lo+w/2 {
				t.Errorf("n=%d shard %d %q: slot %d outside the middle half [%d,%d) of its range", n, i, q, s, lo, lo+w/2)
			}
			if ShardName("rmsnorm", n, i) != q {
				t.Fatal("ShardName is not stable")
			}
		}
	}
	// The largest count still names every shard, each in its range.
	names := ShardNames("q", MaxShards)
	if len(names) != MaxShards || QueueSlot(names[MaxShards-1]) < numSlots-numSlots/MaxShards {
		t.Fatalf("%d shards: last %q in slot %d", MaxShards, names[len(names)-1], QueueSlot(names[len(names)-1]))
	}
	// Every master of an evenly split 3-master cluster (redis-cli's ranges)
	// gets exactly one of 3 shards, and two of 6.
	masters := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	for _, n := range []int{3, 6} {
		per := make([]int, 3)
		for _, q := range ShardNames("rmsnorm", n) {
			for m, r := range masters {
				if s := QueueSlot(q); s >= r[0] && s <= r[1] {
					per[m]++
				}
			}
		}
		if !slices.Equal(per, []int{n / 3, n / 3, n / 3}) {
			t.Errorf("n=%d: shards per master %v, want %d each", n, per, n/3)
		}
	}
}

func TestShardOf(t *testing.T) {
	const n, ids = 3, 30000
	count := make([]int, n)
	for i := range ids {
		id := fmt.Sprintf("job-%d", i)
		s := ShardOf(id, n)
		if s != ShardOf(id, n) {
			t.Fatal("ShardOf is not stable")
		}
		count[s]++
	}
	for s, c := range count {
		if c < ids/n*95/100 || c > ids/n*105/100 {
			t.Errorf("shard %d got %d of %d ids, want within 5%% of %d", s, c, ids, ids/n)
		}
	}
	if ShardOf("x", 1) != 0 || ShardOf("x", 0) != 0 {
		t.Fatal("one shard: every id is shard 0")
	}
	// FNV-1a 32 of "a" is 0xe40c292c: the wire format other clients follow.
	if got := ShardOf("a", 1000); got != int(uint32(0xe40c292c)%1000) {
		t.Fatalf("ShardOf(a, 1000) = %d, want FNV-1a", got)
	}
}

func TestPlanServers(t *testing.T) {
	now := time.Now()
	weights := map[string]int{"hi": 2, "lo": 1}
	// Unsharded: one server with the configured queues, exactly.
	plan := planServers(map[string]Layout{"hi": {Queue: "hi", Shards: 1}, "lo": {Queue: "lo", Shards: 1}}, weights, now)
	if len(plan) != 1 || !maps.Equal(plan[0], weights) {
		t.Fatalf("unsharded plan %v, want one server with %v", plan, weights)
	}
	// Three shards: server k serves shard k of each queue with the queue's
	// weight, so strict priority orders hi before lo within each server.
	lay := map[string]Layout{"hi": {Queue: "hi", Shards: 3}, "lo": {Queue: "lo", Shards: 3}}
	plan = planServers(lay, weights, now)
	if len(plan) != 3 {
		t.Fatalf("3 shards: %d servers, want 3", len(plan))
	}
	for k, m := range plan {
		want := map[string]int{ShardName("hi", 3, k): 2, ShardName("lo", 3, k): 1}
		if !maps.Equal(m, want) {
			t.Errorf("server %d: %v, want %v", k, m, want)
		}
	}
	// After a reshard 3 -> 2 the old shards are served (spread over the two
	// servers) until their results expire, then no more.
	lay = map[string]Layout{"hi": {Queue: "hi", Shards: 2, Prev: 3, PrevUntil: now.Add(time.Hour)}}
	plan = planServers(lay, map[string]int{"hi": 1}, now)
	var served []string
	for _, m := range plan {
		served = append(served, slices.Collect(maps.Keys(m))...)
	}
	want := append(ShardNames("hi", 2), ShardNames("hi", 3)...)
	slices.Sort(served)
	slices.Sort(want)
	if len(plan) != 2 || !slices.Equal(served, slices.Compact(want)) {
		t.Fatalf("after 3 -> 2: %d servers serving %v, want 2 serving %v", len(plan), served, want)
	}
	plan = planServers(lay, map[string]int{"hi": 1}, now.Add(2*time.Hour))
	if len(plan) != 2 || len(plan[0])+len(plan[1]) != 2 {
		t.Fatalf("after the old results expired: %v, want the 2 new shards only", plan)
	}
}

func TestCheckShards(t *testing.T) {
	l := Layout{Queue: "rmsnorm", Shards: 3}
	if checkShards(l, 0) != nil || checkShards(l, 3) != nil {
		t.Fatal("0 follows, 3 matches")
	}
	err := checkShards(l, 2)
	if !errors.Is(err, ErrLayoutMismatch) {
		t.Fatalf("2 vs 3: %v, want ErrLayoutMismatch", err)
	}
	for _, s := range []string{"configured for 2", "records 3", LayoutKey("rmsnorm"), "enqueue reshard --to 2"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("mismatch error %q lacks %q", err, s)
		}
	}
}
