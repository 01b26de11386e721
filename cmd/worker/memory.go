package main

import "runtime/debug"

// memHeadroom is what the worker needs besides tensor buffers: the Go
// runtime, asynq, the S3 client's connections, the header cache and the
// handler goroutines (faults.TestFlood measures it).
const memHeadroom = 64 << 20

// poolBytes is the bound of the compute backend's buffer pool (in use and
// pooled together) for a memory budget: 1.25 x the budget, the slack
// covering size-class and page rounding, so buffers of shapes the worker
// no longer sees do not stay resident (pinned, on the CUDA backend).
func poolBytes(budget int64) int64 { return budget + budget/4 }

// boundMemory ties the Go heap to budget_bytes: unless GOMEMLIMIT is set,
// Go's soft memory limit becomes 1.5 x the budget + memHeadroom, so the
// collector runs before garbage tensor buffers double the heap (GOGC=100
// would let it grow to twice the live size). The header budget
// (limits.header_budget_bytes) adds to the soft limit: headers being read
// and parsed hold up to that much besides the tensor buffers. It returns
// the soft limit.
func boundMemory(budget, headerBudget int64, getenv func(string) string) int64 {
	if getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1) // the operator's
	}
	limit := budget + budget/2 + headerBudget + memHeadroom
	debug.SetMemoryLimit(limit)
	return limit
}
