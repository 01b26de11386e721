package main

import (
	"runtime/debug"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/compute/cpu"
)

// memHeadroom is what the worker needs besides tensor buffers: the Go
// runtime, asynq, the S3 client's connections, the header cache and the
// handler goroutines (faults.TestFlood measures it).
const memHeadroom = 64 << 20

// boundMemory ties the worker's memory to budget_bytes. The CPU backend's
// buffer pool keeps buffers (in use and pooled together) within 1.25 x the
// budget (the slack covers size-class rounding), so buffers of shapes the
// worker no longer sees do not stay resident; and unless GOMEMLIMIT is set,
// Go's soft memory limit becomes 1.5 x the budget + memHeadroom, so the
// collector runs before garbage tensor buffers double the heap (GOGC=100
// would let it grow to twice the live size). The header budget
// (limits.header_budget_bytes) adds to the soft limit: headers being read
// and parsed hold up to that much besides the tensor buffers. It returns
// the soft limit.
func boundMemory(budget, headerBudget int64, getenv func(string) string) int64 {
	backends["cpu"] = func() (compute.Backend, error) { return cpu.New(cpu.PoolLimit(budget + budget/4)), nil }
	if getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1) // the operator's
	}
	limit := budget + budget/2 + headerBudget + memHeadroom
	debug.SetMemoryLimit(limit)
	return limit
}
