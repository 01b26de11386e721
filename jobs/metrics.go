package jobs

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes a job ends with, the values of the "outcome" label of
// rmsgrad_jobs_total.
const (
	OutcomeOK        = "ok"
	OutcomePermanent = "permanent" // archived: bad input, not allowed, too large, bad signature
	OutcomeRetry     = "retry"     // transient: asynq retries it with backoff
	OutcomeCanceled  = "canceled"  // the handler's context ended (shutdown, timeout)
	OutcomePanic     = "panic"     // a bug: the job's path panicked; asynq recovers it and retries the job
	OutcomeOutage    = "outage"    // a dependency was down (IsOutage): retried, not counted against max_retry
	OutcomeHeld      = "held"      // held at the readiness gate, then handed back to the queue: not counted
)

// Stages timed by rmsgrad_stage_seconds (label "stage").
const (
	StageQueueWait = "queue_wait"
	StageFetch     = "fetch"
	StageBatchWait = "batch_wait"
	StageCompute   = "compute"
	StageStore     = "store"
	StageTotal     = "total"
)

// Metrics are the worker's Prometheus collectors. The zero value is not
// usable; NewMetrics registers them (with a nil Registerer they are live but
// unregistered, which tests use).
type Metrics struct {
	Jobs       *prometheus.CounterVec
	BatchSize  prometheus.Histogram
	Stage      *prometheus.HistogramVec
	BytesIn    prometheus.Counter
	BytesOut   prometheus.Counter
	InFlight   prometheus.Gauge
	DeviceBusy prometheus.Counter
	Fallbacks  prometheus.Counter
	// BadSignatures counts jobs rejected because a signing key is
	// configured and their signature is missing or wrong.
	BadSignatures prometheus.Counter
	// Held is how many jobs wait at the readiness gate now.
	Held prometheus.Gauge
	// Tensors counts the tensors of completed jobs by tensor (x, w, dy,
	// dx, dw) and dtype (F32, BF16, F16): the dtype mix a worker serves.
	Tensors *prometheus.CounterVec
	// Pins counts the jobs that pinned w (w_sha256) by what the pin cache
	// did: hit (w from memory), miss (read and checked), mismatch (w did
	// not hash to the pin: the job failed).
	Pins *prometheus.CounterVec
	// PinBytes is the tensor data the pin cache holds now.
	PinBytes prometheus.Gauge
}

// Pin cache results, the label of rmsgrad_w_pins_total.
const (
	PinHit      = "hit"
	PinMiss     = "miss"
	PinMismatch = "mismatch"
)

// NewMetrics creates the collectors and registers them with reg (if not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rmsgrad_jobs_total", Help: "Jobs handled, by outcome (ok, permanent, retry, canceled, panic, outage, held).",
		}, []string{"outcome"}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "rmsgrad_batch_jobs", Help: "Jobs per committed command buffer.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
		Stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rmsgrad_stage_seconds", Help: "Per-job latency of each stage.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"stage"}),
		BytesIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rmsgrad_bytes_in_total", Help: "Tensor bytes fetched from storage.",
		}),
		BytesOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rmsgrad_bytes_out_total", Help: "Output object bytes written to storage.",
		}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rmsgrad_bytes_in_flight", Help: "Bytes reserved in the memory budget.",
		}),
		DeviceBusy: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rmsgrad_device_busy_seconds_total", Help: "Device time spent in committed command buffers.",
		}),
		Fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rmsgrad_batch_fallbacks_total", Help: "Batches whose command buffer failed and whose jobs were re-run one per command buffer.",
		}),
		BadSignatures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rmsgrad_jobs_bad_signature_total", Help: "Jobs rejected for a missing or wrong HMAC signature (a signing key is configured).",
		}),
		Held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rmsgrad_jobs_held", Help: "Jobs held at the readiness gate while a dependency is down.",
		}),
		Tensors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rmsgrad_tensors_total", Help: "Tensors of completed jobs, by tensor (x, w, dy, dx, dw) and dtype (F32, BF16, F16).",
		}, []string{"tensor", "dtype"}),
		Pins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rmsgrad_w_pins_total", Help: "Jobs that pinned w with w_sha256, by result: hit (w served from the pin cache), miss (w read and checked; mismatches included), mismatch (w did not hash to the pin; the job failed).",
		}, []string{"result"}),
		PinBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rmsgrad_pin_cache_bytes", Help: "Tensor data bytes held in the pin cache (the pinned w tensors).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Jobs, m.BatchSize, m.Stage, m.BytesIn, m.BytesOut, m.InFlight, m.DeviceBusy, m.Fallbacks, m.BadSignatures, m.Held, m.Tensors, m.Pins, m.PinBytes)
	}
	return m
}
