// Command gateway is rmsgrad's HTTP job API: POST /v1/jobs and the batch
// submit, GET /v1/jobs/{id} and its waits, signed upload and download URLs,
// on the same Redis as the workers (package gateway has the API; this is
// flags, config and wiring). See configs/gateway.yaml for every setting,
// docs/gateway.md for the guide, and --dev for a zero-setup gateway beside
// `worker --dev`.
//
//	gateway [--config FILE] [--dev] [--http ADDR] [--print-config]
//	gateway token --name NAME [--append TOKEN_FILE]
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/rmsgrad/rmsgrad/gateway"
	"github.com/rmsgrad/rmsgrad/internal/cliflag"
	"github.com/rmsgrad/rmsgrad/jobs"
)

// quietRedis drops go-redis's own log lines: the gateway reports failed
// calls itself (503 answers, /readyz).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func main() {
	redis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil && !cliflag.Printed(err) {
		fmt.Fprintln(os.Stderr, "gateway:", err)
	}
	os.Exit(cliflag.ExitCode(err))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "token" {
		return cmdToken(args[1:], stdout, stderr)
	}
	cfg, printOnly, err := loadConfig(args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	if printOnly {
		return printConfig(stdout, cfg)
	}
	// The gateway's live heap is a few MiB, and each job posted makes many
	// short-lived objects (its JSON, asynq's task message, go-redis's
	// command): at Go's default target the collector runs so often that
	// it is a large part of the gateway's CPU a job (docs/gateway.md,
	// Benchmarks). The price is heap: about five times the live heap.
	if cfg.GCPercent > 0 && getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(cfg.GCPercent))
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})).With("component", "gateway")

	ropt, err := redisOpt(cfg)
	if err != nil {
		return err
	}
	copts := []jobs.ClientOption{jobs.WithQueue(cfg.Queue), jobs.WithRetention(cfg.Retention),
		jobs.WithMaxRetry(cfg.MaxRetry), jobs.WithTimeout(cfg.Timeout)}
	if cfg.secrets.SigningKey != nil {
		copts = append(copts, jobs.WithSigningKey(cfg.secrets.SigningKey))
	}
	client := jobs.NewClient(ropt, copts...)
	defer client.Close()
	st, err := openStores(ctx, cfg)
	if err != nil {
		return err
	}
	var tokens *gateway.Tokens
	if !cfg.Auth.Disabled {
		if tokens, err = gateway.LoadTokens(cfg.Auth.TokenFiles...); err != nil {
			return fmt.Errorf("config: auth.token_files: %w", err)
		}
		go tokens.Watch(ctx, cfg.Auth.ReloadInterval, log)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ready := append([]gateway.Check{{Name: "redis", Check: client.Ping}}, st.checks...)
	srv, err := gateway.New(gateway.Config{
		Client: client, Store: st.router, Presigner: st.presigner, Files: st.files,
		UploadPrefix: cfg.Uploads.Prefix, PublicURL: cfg.PublicURL, URLExpiry: cfg.Uploads.Expiry,
		Tokens: tokens, RatePerS: cfg.Limits.RequestsPerS, Burst: cfg.Limits.Burst,
		MaxBodyBytes: cfg.Limits.MaxBodyBytes, MaxBatch: cfg.Limits.MaxBatch, MaxWait: cfg.Limits.MaxWait,
		Ready: ready, Registry: reg, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}

	l, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("config: http_addr %q: %w", cfg.HTTPAddr, err)
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		// Long enough for an upload of uploads.max_bytes on a slow link;
		// waits answer within limits.max_wait, well inside WriteTimeout.
		ReadTimeout:  10 * time.Minute,
		WriteTimeout: cfg.Limits.MaxWait + 10*time.Minute,
		IdleTimeout:  2 * time.Minute,
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	scheme := "http"
	errc := make(chan error, 1)
	if cfg.TLS.CertFile != "" {
		scheme = "https"
		go func() { errc <- hs.ServeTLS(l, cfg.TLS.CertFile, cfg.TLS.KeyFile) }()
	} else {
		go func() { errc <- hs.Serve(l) }()
	}
	auth := "off (loopback only)"
	if tokens != nil {
		auth = fmt.Sprintf("bearer tokens (%d)", tokens.Count())
	}
	log.Info("gateway listening", "url", scheme+"://"+l.Addr().String(), "queue", cfg.Queue, "auth", auth,
		"signing", cfg.secrets.SigningKey != nil, "upload_prefix", cfg.Uploads.Prefix, "dev", cfg.Dev.Enabled)
	fmt.Fprintf(stdout, "gateway listening on %s://%s\n", scheme, l.Addr())

	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	log.Info("signal received: finishing the requests in flight", "shutdown_timeout", cfg.Shutdown)
	srv.Drain()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Shutdown)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("gateway stopped")
	return nil
}
