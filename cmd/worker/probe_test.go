package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestProber: readiness follows each dependency's last probe, names the one
// down with its error, and the gauge follows it.
func TestProber(t *testing.T) {
	var storageDown atomic.Bool
	reg := prometheus.NewRegistry()
	p := newProber(reg, slog.New(slog.NewTextHandler(io.Discard, nil)),
		depCheck{"redis", func(context.Context) error { return nil }},
		depCheck{"storage", func(context.Context) error {
			if storageDown.Load() {
				return errors.New("connection refused")
			}
			return nil
		}})
	if err := p.ready(); err == nil || !strings.Contains(err.Error(), "not probed yet") || !strings.Contains(err.Error(), "starting") {
		t.Fatalf("before the first probe: %v, want not ready, starting", err)
	}
	ctx := context.Background()
	p.probe(ctx)
	// Every dependency up, but the worker does not serve jobs yet.
	if err := p.ready(); err == nil || err.Error() != "starting: not serving jobs yet" {
		t.Fatalf("all up, not serving yet: %v, want only starting", err)
	}
	p.markServing()
	if err := p.ready(); err != nil {
		t.Fatalf("all up: %v", err)
	}
	storageDown.Store(true)
	p.probe(ctx)
	err := p.ready()
	if err == nil || !strings.Contains(err.Error(), "storage: down for") || !strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "redis") {
		t.Fatalf("storage down: %v", err)
	}
	if v := gauge(t, reg, "storage"); v != 0 {
		t.Fatalf("rmsgrad_dependency_up{storage} = %v while down", v)
	}
	storageDown.Store(false)
	p.probe(ctx)
	if err := p.ready(); err != nil {
		t.Fatalf("storage back: %v", err)
	}
	if v := gauge(t, reg, "storage"); v != 1 {
		t.Fatalf("rmsgrad_dependency_up{storage} = %v after recovery", v)
	}
}

// gauge reads rmsgrad_dependency_up{dependency=dep} from reg.
func gauge(t *testing.T, reg *prometheus.Registry, dep string) float64 {
	t.Helper()
	return gaugeOf(t, reg, "rmsgrad_dependency_up", "dependency", dep)
}

// gaugeOf reads the gauge name{label=value} from reg (label "": the
// gauge's only series).
func gaugeOf(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ok := label == ""
			for _, l := range m.GetLabel() {
				ok = ok || l.GetName() == label && l.GetValue() == value
			}
			if ok {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}
