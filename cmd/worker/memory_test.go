package main

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
)

// The buffer pool's gauges follow a buffer from in use to pooled, and give
// the limit the worker opened the backend with.
func TestPoolMetrics(t *testing.T) {
	const budget = 64 << 20
	be := cpu.New(cpu.PoolLimit(poolBytes(budget)))
	reg := prometheus.NewRegistry()
	registerPoolMetrics(reg, be)
	read := func(name, state string) float64 {
		t.Helper()
		if state == "" {
			return gaugeOf(t, reg, name, "", "")
		}
		return gaugeOf(t, reg, name, "state", state)
	}
	if got := read("rmsgrad_buffer_pool_limit_bytes", ""); got != float64(poolBytes(budget)) {
		t.Fatalf("limit gauge %v, want %d", got, poolBytes(budget))
	}
	x, err := be.Alloc(compute.F32, 1<<20) // 4 MiB, a size class of its own
	if err != nil {
		t.Fatal(err)
	}
	if in, pooled := read("rmsgrad_buffer_pool_bytes", "in_use"), read("rmsgrad_buffer_pool_bytes", "pooled"); in != 4<<20 || pooled != 0 {
		t.Fatalf("with a 4 MiB buffer in use: in_use %v, pooled %v", in, pooled)
	}
	x.Release()
	if in, pooled := read("rmsgrad_buffer_pool_bytes", "in_use"), read("rmsgrad_buffer_pool_bytes", "pooled"); in != 0 || pooled != 4<<20 {
		t.Fatalf("after its release: in_use %v, pooled %v", in, pooled)
	}
}
