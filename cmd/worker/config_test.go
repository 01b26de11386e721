package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigShippedFileIsValid(t *testing.T) {
	cfg, _, err := loadConfig([]string{"--config", "../../configs/worker.yaml"}, env(nil), io.Discard)
	if err != nil {
		t.Fatalf("configs/worker.yaml: %v", err)
	}
	def := defaultConfig()
	def.Worker = cfg.Worker
	if cfg.Batch != def.Batch || cfg.Limits != def.Limits || cfg.Shutdown != def.Shutdown || cfg.BudgetBytes != def.BudgetBytes {
		t.Fatalf("configs/worker.yaml disagrees with the defaults it documents:\n%+v\n%+v", cfg, def)
	}
}

func TestConfigInvalidNamesTheKey(t *testing.T) {
	cases := []struct{ yaml, key string }{
		{"batch:\n  max_jobz: 3\n", "max_jobz"},
		{"batch:\n  max_jobs: 0\n", "batch.max_jobs"},
		{"backend: tpu\n", "backend"},
		{"concurrency: -1\n", "concurrency"},
		{"procs: -2\n", "procs"},
		{"pin_reserve_bytes: -2\n", "pin_reserve_bytes"},
		{"pin_cache_bytes: -1\n", "pin_cache_bytes"},
		{"limits:\n  max_elements: 99999999999\n", "limits.max_elements"},
		{"redis:\n  url: http://x\n", "redis.url"},
		{"redis:\n  password: hunter2\n", "password"}, // secrets never from the file
		{"storage:\n  s3:\n    allow:\n      - prefix: a/\n", "storage.s3.allow[0].bucket"},
		{"batch:\n  max_wait: forever\n", "forever"},
		{"outage_hold: 0s\n", "outage_hold"},
		{"limits:\n  max_header_bytes: 100000000\n", "limits.header_budget_bytes"},
		{"storage:\n  file_allow:\n    - prefix: /abs/\n", "storage.file_allow[0].prefix"},
		{"storage:\n  s3:\n    stale_upload_age: 10ms\n", "storage.s3.stale_upload_age"},
	}
	for _, c := range cases {
		_, _, err := loadConfig([]string{"--config", writeFile(t, "w.yaml", c.yaml)}, env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("config %q: error %v does not name %q", c.yaml, err, c.key)
		}
	}
	_, _, err := loadConfig(nil, env(map[string]string{"RMSGRAD_CONCURRENCY": "many"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "concurrency") || !strings.Contains(err.Error(), "RMSGRAD_CONCURRENCY") {
		t.Errorf("bad env value: %v", err)
	}
}

func TestConfigPrecedence(t *testing.T) {
	file := writeFile(t, "w.yaml", "concurrency: 8\nbackend: cpu\nredis:\n  addr: file:1\nbatch:\n  max_wait: 7ms\n")
	cfg, _, err := loadConfig([]string{"--config", file, "--backend", "cuda"},
		env(map[string]string{"RMSGRAD_REDIS_ADDR": "env:2", "RMSGRAD_BACKEND": "metal"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Concurrency != 8 || cfg.Batch.MaxWait != 7*time.Millisecond {
		t.Fatalf("file values lost: %+v", cfg)
	}
	if cfg.Redis.Addr != "env:2" {
		t.Fatalf("env did not override the file: redis.addr = %q", cfg.Redis.Addr)
	}
	if cfg.Backend != "cuda" {
		t.Fatalf("flag did not override env: backend = %q", cfg.Backend)
	}
}

// TestConfigProcs: procs from the file, RMSGRAD_PROCS over it, --procs
// over both, and setProcs applies it and hands back the value before.
func TestConfigProcs(t *testing.T) {
	file := writeFile(t, "w.yaml", "procs: 3\n")
	for _, c := range []struct {
		args []string
		env  map[string]string
		want int
	}{
		{nil, nil, 0},
		{[]string{"--config", file}, nil, 3},
		{[]string{"--config", file}, map[string]string{"RMSGRAD_PROCS": "5"}, 5},
		{[]string{"--config", file, "--procs", "1"}, map[string]string{"RMSGRAD_PROCS": "5"}, 1},
	} {
		cfg, _, err := loadConfig(c.args, env(c.env), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Procs != c.want {
			t.Errorf("args %q env %v: procs = %d, want %d", c.args, c.env, cfg.Procs, c.want)
		}
	}
	before := runtime.GOMAXPROCS(0)
	if got := setProcs(0); got != before || runtime.GOMAXPROCS(0) != before {
		t.Fatalf("setProcs(0) changed GOMAXPROCS %d -> %d (returned %d)", before, runtime.GOMAXPROCS(0), got)
	}
	if got := setProcs(before + 1); got != before || runtime.GOMAXPROCS(0) != before+1 {
		t.Fatalf("setProcs(%d): GOMAXPROCS %d, returned %d", before+1, runtime.GOMAXPROCS(0), got)
	}
	runtime.GOMAXPROCS(before)
}

func TestPrintConfigRedactsSecrets(t *testing.T) {
	keyFile := writeFile(t, "sk", "s3-secret-value\n")
	file := writeFile(t, "w.yaml", "redis:\n  url: rediss://bob:url-password@r:6380/2\nstorage:\n  s3:\n    endpoint: s3:9000\n    secret_key_file: "+keyFile+"\n")
	e := env(map[string]string{"RMSGRAD_REDIS_PASSWORD": "redis-pw-value", "RMSGRAD_S3_ACCESS_KEY": "access-value", "RMSGRAD_SIGNING_KEY": "sign-value"})
	var out bytes.Buffer
	if err := run([]string{"--config", file, "--print-config"}, e, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, secret := range []string{"redis-pw-value", "s3-secret-value", "access-value", "sign-value", "url-password"} {
		if strings.Contains(s, secret) {
			t.Fatalf("--print-config leaks %q:\n%s", secret, s)
		}
	}
	for _, want := range []string{"concurrency: 64", "max_jobs: 32", "REDACTED", "redis password: <redacted> from env RMSGRAD_REDIS_PASSWORD",
		"s3 secret key: <redacted> from storage.s3.secret_key_file", "signing key: <redacted>"} {
		if !strings.Contains(s, want) {
			t.Fatalf("--print-config lacks %q:\n%s", want, s)
		}
	}
	cfg, _, err := loadConfig([]string{"--config", file}, e, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.secrets.S3SecretKey != "s3-secret-value" || string(cfg.secrets.SigningKey) != "sign-value" {
		t.Fatal("secrets not loaded from env and file")
	}
}

// TestRedisURLKeepsACLUser: asynq.ParseRedisURI drops the user name of
// redis://user:pass@host; the worker must keep it (and let redis.username
// override it), or an ACL user given by URL fails to authenticate.
func TestRedisURLKeepsACLUser(t *testing.T) {
	for _, tc := range []struct{ url, username, want string }{
		{"redis://alice:pw@127.0.0.1:6380/2", "", "alice"},
		{"redis://alice:pw@127.0.0.1:6380/2", "bob", "bob"},
		{"redis://127.0.0.1:6380", "", ""},
	} {
		cfg := defaultConfig()
		cfg.Redis.URL, cfg.Redis.Username = tc.url, tc.username
		opt, err := redisOpt(cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		c, ok := opt.(asynq.RedisClientOpt)
		if !ok {
			t.Fatalf("%s: got %T", tc.url, opt)
		}
		if c.Username != tc.want || c.Addr != "127.0.0.1:6380" {
			t.Errorf("%s (username %q): Username %q Addr %q, want %q", tc.url, tc.username, c.Username, c.Addr, tc.want)
		}
	}
}

// TestConfigS3DisableFastPath: storage.s3.disable_fast_path is off by
// default (also in the shipped file), is read from the file, reaches
// s3.Config, and must be a bool.
func TestConfigS3DisableFastPath(t *testing.T) {
	cfg, _, err := loadConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Storage.S3.DisableFastPath || s3Config(cfg).DisableFastPath {
		t.Error("disable_fast_path is on by default")
	}
	cfg, _, err = loadConfig([]string{"--config", "../../configs/worker.yaml"}, env(nil), io.Discard)
	if err != nil || cfg.Storage.S3.DisableFastPath {
		t.Errorf("configs/worker.yaml: disable_fast_path %v, %v; want false", cfg.Storage.S3.DisableFastPath, err)
	}
	file := writeFile(t, "w.yaml", "storage:\n  s3:\n    endpoint: s3:9000\n    disable_fast_path: true\n    allow:\n      - bucket: b\n        prefix: in/\n")
	cfg, _, err = loadConfig([]string{"--config", file}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sc := s3Config(cfg)
	if !sc.DisableFastPath || sc.Endpoint != "s3:9000" || len(sc.Allow) != 1 || sc.Allow[0].Bucket != "b" {
		t.Errorf("s3.Config %+v: want DisableFastPath and the section's other keys", sc)
	}
	_, _, err = loadConfig([]string{"--config", writeFile(t, "w.yaml", "storage:\n  s3:\n    disable_fast_path: maybe\n")}, env(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "maybe") {
		t.Errorf("disable_fast_path: maybe: error %v does not name the value", err)
	}
}

// TestConfigSharedReads: storage.disable_shared_reads is off by default
// (also in the shipped file) and, when set, reaches the router.
func TestConfigSharedReads(t *testing.T) {
	for _, args := range [][]string{nil, {"--config", "../../configs/worker.yaml"}} {
		cfg, _, err := loadConfig(args, env(nil), io.Discard)
		if err != nil || cfg.Storage.DisableSharedReads {
			t.Errorf("%v: disable_shared_reads %v, %v; want false", args, cfg.Storage.DisableSharedReads, err)
		}
	}
	file := writeFile(t, "w.yaml", "storage:\n  disable_shared_reads: true\n  file_root: "+t.TempDir()+"\n")
	cfg, _, err := loadConfig([]string{"--config", file}, env(nil), io.Discard)
	if err != nil || !cfg.Storage.DisableSharedReads {
		t.Fatalf("disable_shared_reads: true read as %v, %v", cfg.Storage.DisableSharedReads, err)
	}
	for _, off := range []bool{false, true} {
		cfg.Storage.DisableSharedReads = off
		rs, err := openStore(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := rs.r.SharesReads(); got == off {
			t.Errorf("disable_shared_reads %v: router shares reads: %v", off, got)
		}
	}
}

// procs 0 on the cuda backend: at most gpuHostMaxProcs, never 0.
func TestGPUHostProcs(t *testing.T) {
	for _, c := range []struct{ n, want int }{{1, 1}, {4, 4}, {8, 8}, {16, 8}, {128, 8}, {0, 1}} {
		if got := gpuHostProcs(c.n); got != c.want {
			t.Errorf("gpuHostProcs(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}
