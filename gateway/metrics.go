package gateway

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's Prometheus collectors. Labels are route
// patterns and outcomes, never token names or ids.
type metrics struct {
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
	jobs     *prometheus.CounterVec
	// jobsEnqueued, jobsRejected and jobsError are jobs' children, looked
	// up once (WithLabelValues hashes and locks on every call).
	jobsEnqueued, jobsRejected, jobsError prometheus.Counter
	authFailures                          prometheus.Counter
	rateLimited                           prometheus.Counter
	urls                                  *prometheus.CounterVec
	uploadBytes                           prometheus.Counter
	depUp                                 *prometheus.GaugeVec
}

// Outcomes of a posted job (rmsgrad_gateway_jobs_total).
const (
	outcomeEnqueued = "enqueued" // enqueued, or the same job again under its id
	outcomeRejected = "rejected" // invalid, outside the allow-list, or its id taken by another job
	outcomeError    = "error"    // Redis failed
)

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rmsgrad_gateway_requests_total", Help: "API requests by route and status code.",
		}, []string{"route", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rmsgrad_gateway_request_seconds", Help: "API request time by route (waits included).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"route"}),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rmsgrad_gateway_jobs_total", Help: "Jobs posted, by outcome: enqueued, rejected (invalid, not allowed, id taken), error (Redis).",
		}, []string{"outcome"}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rmsgrad_gateway_auth_failures_total", Help: "Requests refused for a missing or unknown bearer token.",
		}),
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rmsgrad_gateway_rate_limited_total", Help: "Requests refused by a token's rate limit.",
		}),
		urls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rmsgrad_gateway_urls_total", Help: "Upload (PUT) and download (GET) URLs signed, by store scheme.",
		}, []string{"method", "scheme"}),
		uploadBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rmsgrad_gateway_file_upload_bytes_total", Help: "Bytes written into the file store through /v1/files.",
		}),
		depUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rmsgrad_dependency_up", Help: "1 when the dependency (redis, storage) answered the last /readyz, else 0.",
		}, []string{"dependency"}),
	}
	m.jobsEnqueued = m.jobs.WithLabelValues(outcomeEnqueued)
	m.jobsRejected = m.jobs.WithLabelValues(outcomeRejected)
	m.jobsError = m.jobs.WithLabelValues(outcomeError)
	if reg != nil {
		reg.MustRegister(m.requests, m.seconds, m.jobs, m.authFailures, m.rateLimited, m.urls, m.uploadBytes, m.depUp)
	}
	return m
}

// observe counts and times each request of route.
func (s *Server) observe(route string, h http.Handler) http.Handler {
	hist := s.metrics.seconds.WithLabelValues(route)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		hist.Observe(time.Since(start).Seconds())
		s.metrics.requests.WithLabelValues(route, strconv.Itoa(sw.status)).Inc()
	})
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
