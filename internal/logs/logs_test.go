package logs

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

type line struct {
	Level     string `json:"level"`
	Msg       string `json:"msg"`
	Component string `json:"component"`
}

func lines(t *testing.T, b *bytes.Buffer) []line {
	t.Helper()
	var out []line
	for _, s := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("not a JSON line: %q", s)
		}
		out = append(out, l)
	}
	return out
}

func TestAsynqLevels(t *testing.T) {
	var b bytes.Buffer
	a := Asynq(slog.New(slog.NewJSONHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})))
	a.Warn("Retry exhausted for task id=", "t1")
	a.Warn("Failed to write server state data: ", "UNKNOWN: redis command error")
	a.Error("Dequeue error: ", "dial tcp: connection refused")
	a.Fatal("fatal")
	a.Info("Starting processing")
	want := []line{
		{"DEBUG", "Retry exhausted for task id=t1", "asynq"},
		{"WARN", "Failed to write server state data: UNKNOWN: redis command error", "asynq"},
		{"ERROR", "Dequeue error: dial tcp: connection refused", "asynq"},
		{"ERROR", "fatal", "asynq"},
		{"INFO", "Starting processing", "asynq"},
	}
	got := lines(t, &b)
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestRedisLevels(t *testing.T) {
	var b bytes.Buffer
	r := Redis(slog.New(slog.NewJSONHandler(&b, nil)))
	r.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v", 5, "dial tcp 127.0.0.1:1: connect: connection refused")
	r.Printf(context.Background(), "addIdleConn panic: %+v", "boom")
	got := lines(t, &b)
	want := []line{
		{"WARN", "connection pool: failed to dial after 5 attempts: dial tcp 127.0.0.1:1: connect: connection refused", "go-redis"},
		{"ERROR", "addIdleConn panic: boom", "go-redis"},
	}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
