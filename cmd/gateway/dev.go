package main

import (
	"path/filepath"
)

// applyDev points the gateway at `worker --dev`: its embedded Redis, its
// data directory as the file store (made here when the worker has not made
// it yet), uploads by count under uploads/ in it, and, with no token file
// named, authentication off (validate still requires a loopback address).
func applyDev(cfg *Config) {
	cfg.Redis = RedisConfig{Addr: cfg.Dev.RedisAddr}
	if dir, err := filepath.Abs(cfg.Dev.Dir); err == nil {
		cfg.Dev.Dir = dir
	}
	cfg.Storage.FileRoot = cfg.Dev.Dir
	if cfg.Uploads.Prefix == "" {
		cfg.Uploads.Prefix = "file://" + filepath.ToSlash(cfg.Dev.Dir) + "/uploads/"
	}
	if len(cfg.Auth.TokenFiles) == 0 {
		cfg.Auth.Disabled = true
	}
}
