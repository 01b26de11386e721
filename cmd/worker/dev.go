package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/alicebob/miniredis/v2"
)

// startDev starts the embedded Redis-protocol server of --dev and makes the
// dev directory, which becomes the file store's root. The caller closes the
// returned server after the asynq server has shut down.
func startDev(cfg *Config) (*miniredis.Miniredis, error) {
	dir, err := filepath.Abs(cfg.Dev.Dir)
	if err != nil {
		return nil, fmt.Errorf("config: dev.dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("config: dev.dir: %w", err)
	}
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr(cfg.Dev.RedisAddr); err != nil {
		return nil, fmt.Errorf("config: dev.redis_addr %q: %w", cfg.Dev.RedisAddr, err)
	}
	cfg.Redis = RedisConfig{Addr: m.Addr()}
	cfg.Storage.FileRoot = dir
	if cfg.Backend == "auto" {
		cfg.Backend = "cpu" // dev mode is about needing nothing; the CPU is always there
	}
	return m, nil
}
