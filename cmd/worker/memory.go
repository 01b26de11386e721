package main

import (
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmsgrad/rmsgrad/compute"
)

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
// would let it grow to twice the live size). extra adds to the soft limit:
// the header budget (limits.header_budget_bytes, headers being read and
// parsed) and the pin cache (pin_cache_bytes), held besides the tensor
// buffers. It returns the soft limit.
func boundMemory(budget, extra int64, getenv func(string) string) int64 {
	if getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1) // the operator's
	}
	limit := budget + budget/2 + extra + memHeadroom
	debug.SetMemoryLimit(limit)
	return limit
}

// poolStater is a backend that reports its buffer pool (the cpu, cuda and
// metal backends): bytes in use, bytes kept for reuse, the limit.
type poolStater interface {
	PoolStats() (live, pooled, limit int64)
}

// registerPoolMetrics exports be's buffer pool, when it reports one:
// rmsgrad_buffer_pool_bytes{state="in_use"|"pooled"} and
// rmsgrad_buffer_pool_limit_bytes (pinned host memory on the cuda backend,
// Metal buffers on a Mac).
func registerPoolMetrics(reg prometheus.Registerer, be compute.Backend) {
	ps, ok := be.(poolStater)
	if !ok {
		return
	}
	const help = "Bytes of the compute backend's buffers by state: in_use (handed to jobs), pooled (kept for reuse); together they stay within the limit unless jobs in use need more."
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rmsgrad_buffer_pool_bytes", Help: help, ConstLabels: prometheus.Labels{"state": "in_use"}},
			func() float64 { live, _, _ := ps.PoolStats(); return float64(live) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rmsgrad_buffer_pool_bytes", Help: help, ConstLabels: prometheus.Labels{"state": "pooled"}},
			func() float64 { _, pooled, _ := ps.PoolStats(); return float64(pooled) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rmsgrad_buffer_pool_limit_bytes", Help: "The bound of the compute backend's buffer pool (1.25 x budget_bytes, plus pin_reserve_bytes on cuda; 0: none)."},
			func() float64 { _, _, limit := ps.PoolStats(); return float64(limit) }),
	)
}
