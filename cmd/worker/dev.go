package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/alicebob/miniredis/v2"

	"github.com/rmsgrad/rmsgrad/internal/devstate"
)

// applyDev turns on what dev mode changes in the configuration: Redis is
// the embedded server at dev.redis_addr (no password: it is the worker's
// own, on loopback), the file store's root is dev.dir made absolute, and
// backend auto means cpu (dev mode is about needing nothing; the CPU is
// always there). S3, if configured, stays. --print-config shows the
// result, and startDev starts from it.
func applyDev(cfg *Config) error {
	dir, err := filepath.Abs(cfg.Dev.Dir)
	if err != nil {
		return fmt.Errorf("config: dev.dir: %w", err)
	}
	cfg.Redis = RedisConfig{Addr: cfg.Dev.RedisAddr}
	cfg.secrets.RedisPassword = ""
	delete(cfg.secrets.from, "redis password")
	cfg.Storage.FileRoot = dir
	if cfg.Backend == "auto" {
		cfg.Backend = "cpu"
	}
	return nil
}

// startDev applies dev mode, makes the dev directory and starts the
// embedded Redis-protocol server; redis.addr becomes the address it
// listens on (a port chosen at start when dev.redis_addr's is 0). The
// caller closes the server after the asynq server has shut down.
func startDev(cfg *Config) (*miniredis.Miniredis, error) {
	if err := applyDev(cfg); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Storage.FileRoot, 0o755); err != nil {
		return nil, fmt.Errorf("config: dev.dir: %w", err)
	}
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr(cfg.Dev.RedisAddr); err != nil {
		return nil, fmt.Errorf("config: dev.redis_addr %q (RMSGRAD_DEV_REDIS_ADDR, --dev-redis): %w", cfg.Dev.RedisAddr, err)
	}
	cfg.Redis.Addr = m.Addr()
	return m, nil
}

// announceDev writes the dev state file the enqueue CLI reads, and tells
// the user on stdout how the CLI finds this worker. It returns the
// function that removes the file.
func announceDev(stdout io.Writer, cfg Config, httpAddr string) (func(), error) {
	root := cfg.Storage.FileRoot
	pid := os.Getpid()
	if err := devstate.Write(root, devstate.State{RedisAddr: cfg.Redis.Addr, FileRoot: root, HTTPAddr: httpAddr, PID: pid}); err != nil {
		return nil, err
	}
	how := "enqueue --dev-dir " + root + " (or " + devstate.EnvDir + "=" + root + ")"
	if wd, err := os.Getwd(); err == nil && filepath.Join(wd, filepath.Clean(devstate.DefaultDir)) == root {
		how = "enqueue run from " + wd + " (or anywhere with --dev-dir " + root + ")"
	}
	fmt.Fprintf(stdout, "dev mode: %s finds this worker through %s, with no other flag\n", how, devstate.Path(root))
	return func() { _ = devstate.Remove(root, pid) }, nil
}
