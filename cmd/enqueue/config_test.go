package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/internal/devstate"
)

// clearEnv blanks every variable the CLI reads, so the caller's
// environment cannot leak into a case.
func clearEnv(t *testing.T) {
	for _, k := range []string{"RMSGRAD_ENQUEUE_CONFIG", "RMSGRAD_REDIS_ADDR", "RMSGRAD_REDIS_USERNAME", "RMSGRAD_REDIS_PASSWORD",
		"RMSGRAD_QUEUE", "RMSGRAD_FILE_ROOT", "RMSGRAD_UPLOAD_PREFIX", "RMSGRAD_S3_ENDPOINT", "RMSGRAD_S3_ACCESS_KEY",
		"RMSGRAD_S3_SECRET_KEY", "RMSGRAD_SIGNING_KEY", "RMSGRAD_DEV_DIR"} {
		t.Setenv(k, "")
	}
}

// parseConn parses args as a subcommand would and loads the config.
func parseConn(t *testing.T, args ...string) (config, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cf connFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return loadConfig(&cf)
}

// TestConfigPrecedence: flags > environment > config file > defaults, key
// by key, and where redis.addr came from is known for error messages.
func TestConfigPrecedence(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "enqueue.yaml")
	writeFile(t, path, `redis:
  addr: file-host:1
queue: file-q
retention: 1h
storage:
  file_root: /file-root
  upload_prefix: s3://b/file/
`)
	type want struct {
		addr, from, queue, root, prefix string
	}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want want
	}{
		{"file over defaults", nil, []string{"--config", path},
			want{"file-host:1", "redis.addr in " + path, "file-q", "/file-root", "s3://b/file/"}},
		{"env over file", map[string]string{"RMSGRAD_REDIS_ADDR": "env-host:2", "RMSGRAD_QUEUE": "env-q", "RMSGRAD_FILE_ROOT": "/env-root"},
			[]string{"--config", path}, want{"env-host:2", "env RMSGRAD_REDIS_ADDR", "env-q", "/env-root", "s3://b/file/"}},
		{"flags over env", map[string]string{"RMSGRAD_REDIS_ADDR": "env-host:2", "RMSGRAD_QUEUE": "env-q", "RMSGRAD_UPLOAD_PREFIX": "s3://b/env/"},
			[]string{"--config", path, "--redis", "flag-host:3", "--queue", "flag-q", "--root", "/flag-root"},
			want{"flag-host:3", "flag --redis", "flag-q", "/flag-root", "s3://b/env/"}},
		{"config named by env", map[string]string{"RMSGRAD_ENQUEUE_CONFIG": path}, nil,
			want{"file-host:1", "redis.addr in " + path, "file-q", "/file-root", "s3://b/file/"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			cfg, err := parseConn(t, c.args...)
			if err != nil {
				t.Fatal(err)
			}
			got := want{cfg.Redis.Addr, cfg.redisFrom, cfg.Queue, cfg.Storage.FileRoot, cfg.Storage.UploadPrefix}
			if got != c.want {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
			// Keys no layer above set keep the file's value or the default.
			if cfg.Retention != time.Hour || cfg.MaxRetry != 10 || cfg.Timeout != 10*time.Minute {
				t.Fatalf("retention %v, max_retry %d, timeout %v: want 1h from the file and the defaults 10, 10m", cfg.Retention, cfg.MaxRetry, cfg.Timeout)
			}
		})
	}

	t.Run("defaults and the implicit configs/enqueue.yaml", func(t *testing.T) {
		t.Chdir(t.TempDir())
		cfg, err := parseConn(t)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Redis.Addr != "127.0.0.1:6379" || cfg.redisFrom != "the default" || cfg.Queue != "rmsnorm" || cfg.Retention != 24*time.Hour {
			t.Fatalf("defaults: %+v", cfg)
		}
		if err := os.Mkdir("configs", 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, "configs/enqueue.yaml", "queue: implicit-q\n")
		if cfg, err = parseConn(t); err != nil || cfg.Queue != "implicit-q" {
			t.Fatalf("configs/enqueue.yaml in the working directory not read: %v, queue %q", err, cfg.Queue)
		}
	})

	t.Run("errors name the file and the key", func(t *testing.T) {
		bad := filepath.Join(dir, "bad.yaml")
		writeFile(t, bad, "redis:\n  adress: x:1\n")
		if _, err := parseConn(t, "--config", bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "adress") {
			t.Fatalf("misspelt key: %v", err)
		}
		zero := filepath.Join(dir, "zero.yaml")
		writeFile(t, zero, "retention: 0s\n")
		if _, err := parseConn(t, "--config", zero); err == nil || !strings.Contains(err.Error(), "retention") {
			t.Fatalf("retention 0: %v", err)
		}
		if _, err := parseConn(t, "--config", filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
			t.Fatalf("missing explicit config: %v", err)
		}
		if _, err := parseConn(t, "--config", path, "--queue", ""); err != nil {
			t.Fatalf("an empty flag means not given: %v", err)
		}
	})

	t.Run("secrets from env or files, never shown", func(t *testing.T) {
		pw := filepath.Join(dir, "pw")
		writeFile(t, pw, "from-file\n")
		cfgPath := filepath.Join(dir, "secret.yaml")
		writeFile(t, cfgPath, "redis:\n  addr: redis://alice:url-secret@h:7/2\n  password_file: "+pw+"\n")
		cfg, err := parseConn(t, "--config", cfgPath)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.password != "from-file" {
			t.Fatalf("password from password_file: %q", cfg.password)
		}
		if s := cfg.redisShown(); strings.Contains(s, "url-secret") || !strings.Contains(s, "h:7") {
			t.Fatalf("redis address shown as %q", s)
		}
		opt, err := cfg.redisOpt()
		if err != nil {
			t.Fatal(err)
		}
		o, ok := opt.(asynq.RedisClientOpt)
		if !ok || o.Addr != "h:7" || o.DB != 2 || o.Username != "alice" || o.Password != "from-file" {
			t.Fatalf("redis option from URL + password file: %#v", opt)
		}
		t.Setenv("RMSGRAD_REDIS_PASSWORD", "from-env")
		if cfg, err = parseConn(t, "--config", cfgPath); err != nil || cfg.password != "from-env" {
			t.Fatalf("RMSGRAD_REDIS_PASSWORD must win over password_file: %v %q", err, cfg.password)
		}
	})
}

// TestShippedConfigIsTheDefaults: configs/enqueue.yaml parses strictly and
// every value it shows is the default, as its header says.
func TestShippedConfigIsTheDefaults(t *testing.T) {
	clearEnv(t)
	cfg, err := parseConn(t, "--config", "../../configs/enqueue.yaml")
	if err != nil {
		t.Fatal(err)
	}
	def := defaultConfig()
	cfg.redisFrom, def.redisFrom = "", ""
	cfg.file, def.file = "", ""
	if len(cfg.Storage.S3.Buckets) == 0 {
		cfg.Storage.S3.Buckets = nil // "buckets: []" in the file
	}
	if !reflect.DeepEqual(cfg, def) {
		t.Fatalf("configs/enqueue.yaml differs from the defaults:\nfile     %+v\ndefaults %+v", cfg, def)
	}
}

// TestDevStatePrecedence: a dev worker's state file in ./rmsgrad-dev is
// used only when nothing sets a Redis address; one named by --dev-dir or
// RMSGRAD_DEV_DIR wins over the file and the environment; --redis and
// --root win over everything.
func TestDevStatePrecedence(t *testing.T) {
	clearEnv(t)
	work := t.TempDir()
	t.Chdir(work)
	dev := filepath.Join(work, "rmsgrad-dev")
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := devstate.Write(dev, devstate.State{RedisAddr: "127.0.0.1:7001", FileRoot: dev, PID: 1}); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if err := devstate.Write(other, devstate.State{RedisAddr: "127.0.0.1:7002", FileRoot: other, PID: 2}); err != nil {
		t.Fatal(err)
	}
	fileAddr := filepath.Join(work, "addr.yaml")
	writeFile(t, fileAddr, "redis:\n  addr: file-host:1\n")
	fileRoot := filepath.Join(work, "root.yaml")
	writeFile(t, fileRoot, "storage:\n  file_root: /file-root\n")
	devUploads := "file://" + filepath.Join(dev, "uploads") + "/"
	type want struct{ addr, root, prefix, from string }
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want want
	}{
		{"nothing set: the dev worker here", nil, nil,
			want{"127.0.0.1:7001", dev, devUploads, "the dev worker's state file rmsgrad-dev/dev.json"}},
		{"file sets only file_root", nil, []string{"--config", fileRoot},
			want{"127.0.0.1:7001", "/file-root", devUploads, "the dev worker's state file rmsgrad-dev/dev.json"}},
		{"file sets redis.addr", nil, []string{"--config", fileAddr}, want{"file-host:1", "", "", "redis.addr in " + fileAddr}},
		{"env sets it", map[string]string{"RMSGRAD_REDIS_ADDR": "env-host:2"}, nil, want{"env-host:2", "", "", "env RMSGRAD_REDIS_ADDR"}},
		{"--redis", nil, []string{"--redis", "flag-host:3"}, want{"flag-host:3", "", "", "flag --redis"}},
		{"--dev-dir over the file", nil, []string{"--config", fileAddr, "--dev-dir", other},
			want{"127.0.0.1:7002", other, "file://" + filepath.Join(other, "uploads") + "/", "the dev worker's state file " + filepath.Join(other, "dev.json")}},
		{"RMSGRAD_DEV_DIR over the env address", map[string]string{devstate.EnvDir: other, "RMSGRAD_REDIS_ADDR": "env-host:2"}, nil,
			want{"127.0.0.1:7002", other, "file://" + filepath.Join(other, "uploads") + "/", "the dev worker's state file " + filepath.Join(other, "dev.json")}},
		{"--redis and --root over --dev-dir", nil, []string{"--dev-dir", other, "--redis", "flag-host:3", "--root", "/flag-root"},
			want{"flag-host:3", "/flag-root", "", "flag --redis"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			cfg, err := parseConn(t, c.args...)
			if err != nil {
				t.Fatal(err)
			}
			got := want{cfg.Redis.Addr, cfg.Storage.FileRoot, cfg.Storage.UploadPrefix, cfg.redisFrom}
			if got != c.want {
				t.Fatalf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
	if _, err := parseConn(t, "--dev-dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "no dev worker in") {
		t.Errorf("--dev-dir without a state file: %v", err)
	}
	if err := os.WriteFile(devstate.Path(dev), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := parseConn(t); err == nil || !strings.Contains(err.Error(), "dev.json") {
		t.Errorf("a corrupt state file: %v, want an error naming it", err)
	}
}
