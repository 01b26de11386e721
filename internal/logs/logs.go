// Package logs routes the log output of the libraries a long-running
// rmsgrad program uses (asynq, go-redis) into its log/slog logger, so that
// the program's stderr is one JSON stream, each line at a level an operator
// can filter on.
//
// Without it, go-redis prints plain-text lines ("redis: pool.go:770:
// connection pool: failed to dial ...") into the JSON stream whenever Redis
// is unreachable, and asynq logs its own format, including a WARN "Retry
// exhausted" for every job that fails permanently, which the worker's
// handler already logs once, with the job's error.
package logs

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Asynq returns an asynq.Logger writing to l. asynq's levels are kept,
// except its "Retry exhausted for task id=..." warning, which is debug: it
// accompanies every archived task, and the handler logs each failed job
// itself (jobs.Handler: a permanent failure at info, a job out of retries
// at error).
// Its lines carry component=asynq.
func Asynq(l *slog.Logger) asynq.Logger { return asynqLogger{l.With("component", "asynq")} }

type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...)) }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...)) }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...)) }
func (a asynqLogger) Fatal(args ...any) { a.l.Error(fmt.Sprint(args...)) }

func (a asynqLogger) Warn(args ...any) {
	msg := fmt.Sprint(args...)
	if strings.HasPrefix(msg, "Retry exhausted for task") {
		a.l.Debug(msg)
		return
	}
	a.l.Warn(msg)
}

// RedisLogger is go-redis's logger interface (redis.SetLogger).
type RedisLogger interface {
	Printf(ctx context.Context, format string, v ...any)
}

// Redis returns a go-redis logger writing to l: a recovered panic at error
// level, everything else (failed dials, connections dropped by a hook) at
// warn. go-redis gives its lines no level.
// Its lines carry component=go-redis.
func Redis(l *slog.Logger) RedisLogger { return redisLogger{l.With("component", "go-redis")} }

type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	level := slog.LevelWarn
	if strings.Contains(msg, "panic") {
		level = slog.LevelError
	}
	r.l.Log(ctx, level, msg)
}

// SetRedis makes Redis(l) go-redis's logger. go-redis has one logger per
// process, so the last call wins.
func SetRedis(l *slog.Logger) { redis.SetLogger(Redis(l)) }
