package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// queueCollector reports queue depth through asynq's Inspector at scrape
// time, so the numbers are Redis's, not a cached guess.
// The queues are the asynq queues the worker serves now: the shards of
// each logical queue (the logical queue itself when unsharded).
type queueCollector struct {
	insp   *asynq.Inspector
	queues func() []string
	desc   *prometheus.Desc
}

func newQueueCollector(insp *asynq.Inspector, queues func() []string) *queueCollector {
	return &queueCollector{insp: insp, queues: queues, desc: prometheus.NewDesc(
		"rmsgrad_queue_tasks", "Tasks in each asynq queue by state (from asynq.Inspector).", []string{"queue", "state"}, nil)}
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	for _, q := range c.queues() {
		info, err := c.insp.GetQueueInfo(q)
		if err != nil {
			continue // a queue nobody enqueued to yet does not exist
		}
		for state, n := range map[string]int{"pending": info.Pending, "active": info.Active, "scheduled": info.Scheduled,
			"retry": info.Retry, "archived": info.Archived, "completed": info.Completed} {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), q, state)
		}
	}
}

// serveHTTP serves /metrics, /healthz and /readyz on addr until ctx ends.
// /readyz answers from the prober's last probes: 200 "ready", or 503 naming
// each dependency that is down, why, and for how long.
func serveHTTP(ctx context.Context, addr string, reg *prometheus.Registry, ready *prober, log *slog.Logger) (string, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready.ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("config: http_addr %q: %w", addr, err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	go func() {
		if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	return l.Addr().String(), nil
}
