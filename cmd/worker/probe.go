package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// Probe timing: a dependency is checked every probeInterval, and a check
// that takes longer than probeTimeout counts as down. The S3 store retries a
// refused connection for several seconds, so without the timeout an outage
// would look like a slow answer.
const (
	probeInterval = time.Second
	probeTimeout  = 2 * time.Second
)

// depCheck is one dependency readiness depends on.
type depCheck struct {
	name  string // "redis", "storage"
	check func(ctx context.Context) error
}

type depState struct {
	err   error
	since time.Time // when it went down (or came up)
}

// prober checks the worker's dependencies in the background and keeps the
// last answer of each, so /readyz answers at once, reports an outage for as
// long as it lasts, and rmsgrad_dependency_up shows it on /metrics.
// Transitions are logged (down with the error, up with the downtime).
type prober struct {
	deps []depCheck
	up   *prometheus.GaugeVec
	log  *slog.Logger

	// gate, when set, follows readiness: shut while a dependency is
	// down, so the handler takes no new work then.
	gate *jobs.Gate

	mu    sync.Mutex
	state map[string]depState
	// serving is set once the worker serves jobs (markServing): until
	// then readiness says the worker is starting, whatever the probes
	// found, so that 200 from /readyz means jobs are being taken.
	serving bool
}

// markServing records that the worker serves jobs now, and sets the gate
// from the last probes at once instead of at the next round.
func (p *prober) markServing() {
	p.mu.Lock()
	p.serving = true
	p.mu.Unlock()
	if p.gate != nil {
		p.gate.Set(p.ready())
	}
}

func newProber(reg prometheus.Registerer, log *slog.Logger, deps ...depCheck) *prober {
	p := &prober{deps: deps, log: log, state: map[string]depState{},
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rmsgrad_dependency_up",
			Help: "1 when the last probe of the dependency (redis, storage) answered, else 0.",
		}, []string{"dependency"})}
	if reg != nil {
		reg.MustRegister(p.up)
	}
	return p
}

// run probes once at once, then every probeInterval until ctx ends, and
// sets the gate after each round.
func (p *prober) run(ctx context.Context) {
	for t := time.NewTicker(probeInterval); ; {
		p.probe(ctx)
		if p.gate != nil && ctx.Err() == nil {
			p.gate.Set(p.ready())
		}
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// probe checks every dependency concurrently, each under probeTimeout.
func (p *prober) probe(ctx context.Context) {
	var wg sync.WaitGroup
	for _, d := range p.deps {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, probeTimeout)
			err := d.check(cctx)
			timedOut := cctx.Err() != nil // before cancel, which sets it too
			cancel()
			if ctx.Err() != nil {
				return // shutting down: not an outage
			}
			if err != nil && timedOut {
				err = fmt.Errorf("no answer within %v: %w", probeTimeout, err)
			}
			p.record(d.name, err)
		})
	}
	wg.Wait()
}

func (p *prober) record(name string, err error) {
	now := time.Now()
	p.mu.Lock()
	prev, seen := p.state[name]
	st := prev
	st.err = err
	if !seen || (prev.err == nil) != (err == nil) {
		st.since = now
	}
	p.state[name] = st
	p.mu.Unlock()
	if err != nil {
		p.up.WithLabelValues(name).Set(0)
	} else {
		p.up.WithLabelValues(name).Set(1)
	}
	switch {
	case err != nil && (!seen || prev.err == nil):
		p.log.Warn("dependency down: not ready", "dependency", name, "err", err)
	case err == nil && seen && prev.err != nil:
		p.log.Info("dependency up again: ready", "dependency", name, "down_for", now.Sub(prev.since).Round(time.Millisecond).String())
	}
}

// ready returns nil when the worker serves jobs and every dependency
// answered its last probe, else an error saying it is starting and naming
// each dependency down, why, and for how long.
func (p *prober) ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var msgs []string
	if !p.serving {
		msgs = append(msgs, "starting: not serving jobs yet")
	}
	for _, d := range p.deps {
		st, ok := p.state[d.name]
		switch {
		case !ok:
			msgs = append(msgs, d.name+": not probed yet")
		case st.err != nil:
			msgs = append(msgs, fmt.Sprintf("%s: down for %v: %v", d.name, time.Since(st.since).Round(100*time.Millisecond), st.err))
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.New(strings.Join(msgs, "; "))
}
