package main

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmsgrad/rmsgrad/compute"
)

// tracedBackend shows when the device is busy: it counts command buffers in
// flight (rmsgrad_command_buffers_in_flight) and, at debug level, logs each
// command buffer's commit and completion with a sequence number. The fault
// tests kill the worker on a "command buffer committed" line to prove a
// crash mid-batch loses nothing.
type tracedBackend struct {
	compute.Backend
	seq      atomic.Int64
	inFlight prometheus.Gauge
	log      *slog.Logger
}

func newTracedBackend(be compute.Backend, reg prometheus.Registerer, log *slog.Logger) *tracedBackend {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rmsgrad_command_buffers_in_flight", Help: "Command buffers committed to the device and not yet finished.",
	})
	if reg != nil {
		reg.MustRegister(g)
	}
	return &tracedBackend{Backend: be, inFlight: g, log: log}
}

// Execute runs ops on the wrapped backend.
func (b *tracedBackend) Execute(ctx context.Context, ops []compute.Op) (time.Duration, error) {
	n := b.seq.Add(1)
	b.inFlight.Inc()
	defer b.inFlight.Dec()
	debug := b.log.Enabled(ctx, slog.LevelDebug)
	if debug {
		jobs := 0
		for i := range ops {
			if ops[i].Kind == compute.OpRMSInv {
				jobs++
			}
		}
		b.log.Debug("command buffer committed", "cb", n, "jobs", jobs, "ops", len(ops))
	}
	d, err := b.Backend.Execute(ctx, ops)
	if debug {
		b.log.Debug("command buffer done", "cb", n, "device_ms", float64(d.Microseconds())/1000, "err", err)
	}
	return d, err
}
