package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rmsgrad/rmsgrad/internal/cliflag"
	"github.com/rmsgrad/rmsgrad/internal/redisconf"
	"github.com/rmsgrad/rmsgrad/internal/secret"
)

// Config is the gateway's configuration: configs/gateway.yaml documents
// every key with its default. Precedence: defaults < file < environment <
// flags. Secrets (the Redis password, S3 keys, the job-signing key, the
// URL key) come only from the environment or from files the config names,
// and are never printed.
type Config struct {
	HTTPAddr       string        `yaml:"http_addr"`
	PublicURL      string        `yaml:"public_url"` // base URL of file URLs; "" = each request's scheme and Host
	LogLevel       string        `yaml:"log_level"`
	Queue          string        `yaml:"queue"`
	MaxRetry       int           `yaml:"max_retry"`
	Timeout        time.Duration `yaml:"timeout"`
	Retention      time.Duration `yaml:"retention"`
	SigningKeyFile string        `yaml:"signing_key_file"`
	Shutdown       time.Duration `yaml:"shutdown_timeout"`
	// GCPercent is the Go GC's target (debug.SetGCPercent) when the GOGC
	// variable is not set; 0 keeps Go's default (100).
	GCPercent int           `yaml:"gc_percent"`
	TLS       TLSConfig     `yaml:"tls"`
	Auth      AuthConfig    `yaml:"auth"`
	Limits    LimitsConfig  `yaml:"limits"`
	Redis     RedisConfig   `yaml:"redis"`
	Storage   StorageConfig `yaml:"storage"`
	Uploads   UploadsConfig `yaml:"uploads"`
	Dev       DevConfig     `yaml:"dev"`

	secrets secrets
}

// TLSConfig serves HTTPS when both files are set.
type TLSConfig struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// AuthConfig is bearer-token authentication.
type AuthConfig struct {
	TokenFiles     []string      `yaml:"token_files"`
	Disabled       bool          `yaml:"disabled"` // only on a loopback http_addr
	ReloadInterval time.Duration `yaml:"reload_interval"`
}

// LimitsConfig bounds requests.
type LimitsConfig struct {
	RequestsPerS float64       `yaml:"requests_per_s"` // per token; 0 = unlimited
	Burst        int           `yaml:"burst"`
	MaxBodyBytes int64         `yaml:"max_body_bytes"`
	MaxBatch     int           `yaml:"max_batch"`
	MaxWait      time.Duration `yaml:"max_wait"`
}

// RedisConfig says how to reach Redis, as the worker's redis section (one
// Redis, Sentinel or a Cluster).
type RedisConfig = redisconf.Config

// StorageConfig is the allow-list jobs, uploads and downloads are checked
// against (keep it the workers'), and the stores URLs are signed for.
type StorageConfig struct {
	FileRoot string   `yaml:"file_root"`
	S3       S3Config `yaml:"s3"`
}

// S3Config is the S3 store URLs are presigned for.
type S3Config struct {
	Endpoint string `yaml:"endpoint"`
	// PresignEndpoint is the host:port callers reach S3 at, when it is not
	// the gateway's own endpoint (a presigned URL names its host).
	PresignEndpoint string      `yaml:"presign_endpoint"`
	Region          string      `yaml:"region"`
	TLS             bool        `yaml:"tls"`
	CAFile          string      `yaml:"ca_file"`
	AccessKeyFile   string      `yaml:"access_key_file"`
	SecretKeyFile   string      `yaml:"secret_key_file"`
	Allow           []AllowRule `yaml:"allow"`
}

// AllowRule permits a bucket, optionally only under a key prefix.
type AllowRule struct {
	Bucket string `yaml:"bucket"`
	Prefix string `yaml:"prefix"`
}

// UploadsConfig is the signed upload and download URLs.
type UploadsConfig struct {
	Prefix     string        `yaml:"prefix"` // where uploads by count go: s3://bucket/prefix/ or file:///dir/
	Expiry     time.Duration `yaml:"expiry"`
	MaxBytes   int64         `yaml:"max_bytes"`    // one upload through /v1/files (file store only)
	URLKeyFile string        `yaml:"url_key_file"` // signs /v1/files URLs; "" = random per process
}

// DevConfig is --dev: beside `worker --dev`, nothing installed.
type DevConfig struct {
	Enabled   bool   `yaml:"enabled"`
	RedisAddr string `yaml:"redis_addr"`
	Dir       string `yaml:"dir"`
}

type secrets struct {
	RedisPassword, S3AccessKey, S3SecretKey string
	SigningKey, URLKey                      []byte
	from                                    map[string]string
}

func defaultConfig() Config {
	return Config{
		HTTPAddr: "127.0.0.1:8080", LogLevel: "info", Queue: "rmsnorm",
		MaxRetry: 10, Timeout: 10 * time.Minute, Retention: 24 * time.Hour, Shutdown: 30 * time.Second,
		GCPercent: 400,
		Auth:      AuthConfig{ReloadInterval: 5 * time.Second},
		Limits:    LimitsConfig{RequestsPerS: 100, Burst: 200, MaxBodyBytes: 1 << 20, MaxBatch: 1000, MaxWait: 60 * time.Second},
		Redis:     RedisConfig{Addr: "127.0.0.1:6379"},
		Storage:   StorageConfig{S3: S3Config{Region: "us-east-1", TLS: true}},
		Uploads:   UploadsConfig{Expiry: 5 * time.Minute, MaxBytes: 64 << 20},
		Dev:       DevConfig{RedisAddr: "127.0.0.1:6390", Dir: "./rmsgrad-dev"},
	}
}

const gatewayUsage = `usage: gateway [flags]
       gateway token --name NAME [--append FILE]

The rmsgrad HTTP gateway: the job queue over HTTP (POST /v1/jobs, GET
/v1/jobs/{id}, presigned uploads and downloads) for clients in any language.
Settings come from the YAML file (--config or RMSGRAD_GATEWAY_CONFIG), then
RMSGRAD_* variables, then these flags; every key is in configs/gateway.yaml
and docs/gateway.md. --print-config shows the configuration it would run
with, every default filled in.

  gateway --dev                      beside a dev worker, nothing installed
  gateway --config /etc/rmsgrad/gateway.yaml

flags:
`

// loadConfig builds the effective configuration from args and the
// environment; printOnly reports --print-config. --help's usage goes to
// stdout.
func loadConfig(args []string, getenv func(string) string, stdout, stderr io.Writer) (cfg Config, printOnly bool, err error) {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), gatewayUsage)
		fs.PrintDefaults()
	}
	path := fs.String("config", getenv("RMSGRAD_GATEWAY_CONFIG"), "YAML config file (env RMSGRAD_GATEWAY_CONFIG)")
	printCfg := fs.Bool("print-config", false, "print the effective configuration (secrets redacted) and exit")
	dev := fs.Bool("dev", false, "zero-setup mode beside a dev worker (worker --dev): its embedded Redis, its file store, uploads through the gateway")
	httpAddr := fs.String("http", "", "listen address of the API")
	redis := fs.String("redis", "", "Redis host:port, or a redis:// / rediss:// URL")
	devRedis := fs.String("dev-redis", "", "dev mode: the dev worker's Redis address")
	devDir := fs.String("dev-dir", "", "dev mode: the dev worker's data directory")
	logLevel := fs.String("log-level", "", "debug|info|warn|error")
	if err := cliflag.Parse(fs, args, stdout, stderr); err != nil {
		return cfg, false, err
	}
	if fs.NArg() > 0 {
		return cfg, false, cliflag.Usagef("unexpected arguments %q (every setting is a --flag; see gateway --help)", fs.Args())
	}
	cfg = defaultConfig()
	if *path != "" {
		b, err := os.ReadFile(*path)
		if err != nil {
			return cfg, false, fmt.Errorf("config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
			return cfg, false, fmt.Errorf("config %s: %w", *path, err)
		}
	}
	if err := applyEnv(&cfg, getenv); err != nil {
		return cfg, false, err
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "dev":
			cfg.Dev.Enabled = *dev
		case "http":
			cfg.HTTPAddr = *httpAddr
		case "redis":
			if strings.Contains(*redis, "://") {
				cfg.Redis.URL = *redis
			} else {
				cfg.Redis.Addr = *redis
			}
		case "dev-redis":
			cfg.Dev.RedisAddr = *devRedis
		case "dev-dir":
			cfg.Dev.Dir = *devDir
		case "log-level":
			cfg.LogLevel = *logLevel
		}
	})
	if cfg.Dev.Enabled {
		applyDev(&cfg)
	}
	if err := loadSecrets(&cfg, getenv); err != nil {
		return cfg, false, err
	}
	if err := cfg.validate(); err != nil {
		return cfg, false, err
	}
	return cfg, *printCfg, nil
}

// envVars maps each overridable key to its variable.
var envVars = []struct{ env, key string }{
	{"RMSGRAD_GATEWAY_HTTP_ADDR", "http_addr"}, {"RMSGRAD_GATEWAY_PUBLIC_URL", "public_url"},
	{"RMSGRAD_LOG_LEVEL", "log_level"}, {"RMSGRAD_QUEUE", "queue"},
	{"RMSGRAD_REDIS_ADDR", "redis.addr"}, {"RMSGRAD_REDIS_URL", "redis.url"},
	{"RMSGRAD_REDIS_CLUSTER_ADDRS", "redis.cluster_addrs"},
	{"RMSGRAD_FILE_ROOT", "storage.file_root"}, {"RMSGRAD_S3_ENDPOINT", "storage.s3.endpoint"},
	{"RMSGRAD_UPLOAD_PREFIX", "uploads.prefix"},
	{"RMSGRAD_DEV_REDIS_ADDR", "dev.redis_addr"}, {"RMSGRAD_DEV_DIR", "dev.dir"},
}

func applyEnv(cfg *Config, getenv func(string) string) error {
	for _, e := range envVars {
		v := getenv(e.env)
		if v == "" {
			continue
		}
		switch e.key {
		case "http_addr":
			cfg.HTTPAddr = v
		case "public_url":
			cfg.PublicURL = v
		case "log_level":
			cfg.LogLevel = v
		case "queue":
			cfg.Queue = v
		case "redis.addr":
			cfg.Redis.Addr = v
		case "redis.url":
			cfg.Redis.URL = v
		case "redis.cluster_addrs":
			cfg.Redis.ClusterAddrs = redisconf.SplitAddrs(v)
		case "storage.file_root":
			cfg.Storage.FileRoot = v
		case "storage.s3.endpoint":
			cfg.Storage.S3.Endpoint = v
		case "uploads.prefix":
			cfg.Uploads.Prefix = v
		case "dev.redis_addr":
			cfg.Dev.RedisAddr = v
		case "dev.dir":
			cfg.Dev.Dir = v
		}
	}
	return nil
}

// loadSecrets reads each secret from its variable, else from its file.
func loadSecrets(cfg *Config, getenv func(string) string) error {
	s := &cfg.secrets
	src := secret.NewSource(getenv)
	s.from = src.From
	get := src.Get
	var err error
	if s.RedisPassword, err = get("redis password", "RMSGRAD_REDIS_PASSWORD", cfg.Redis.PasswordFile, "redis.password_file"); err != nil {
		return err
	}
	if s.S3AccessKey, err = get("s3 access key", "RMSGRAD_S3_ACCESS_KEY", cfg.Storage.S3.AccessKeyFile, "storage.s3.access_key_file"); err != nil {
		return err
	}
	if s.S3SecretKey, err = get("s3 secret key", "RMSGRAD_S3_SECRET_KEY", cfg.Storage.S3.SecretKeyFile, "storage.s3.secret_key_file"); err != nil {
		return err
	}
	k, err := get("signing key", "RMSGRAD_SIGNING_KEY", cfg.SigningKeyFile, "signing_key_file")
	if err != nil {
		return err
	}
	if k != "" {
		s.SigningKey = []byte(k)
	}
	k, err = get("url key", "RMSGRAD_GATEWAY_URL_KEY", cfg.Uploads.URLKeyFile, "uploads.url_key_file")
	if err != nil {
		return err
	}
	if k != "" {
		s.URLKey = []byte(k)
	}
	return nil
}

func (c *Config) validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	if err := c.Redis.Validate(); err != nil {
		return err
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return bad("log_level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	if c.Queue == "" {
		return bad("queue", "must not be empty")
	}
	if c.MaxRetry < 0 || c.Timeout <= 0 {
		return bad("max_retry", "want max_retry >= 0 and timeout > 0, got %d and %v", c.MaxRetry, c.Timeout)
	}
	if c.Retention <= 0 {
		return bad("retention", "must be > 0 (asynq deletes a result at once without it, and no wait could read it), got %v", c.Retention)
	}
	if c.Shutdown <= 0 {
		return bad("shutdown_timeout", "must be > 0, got %v", c.Shutdown)
	}
	if c.GCPercent < 0 {
		return bad("gc_percent", "must be >= 0 (0: Go's default), got %d", c.GCPercent)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return bad("tls.cert_file", "tls.cert_file and tls.key_file go together")
	}
	if len(c.Auth.TokenFiles) == 0 && !c.Auth.Disabled {
		return bad("auth.token_files", "no token file: name at least one (make tokens with `gateway token`), or set auth.disabled: true on a loopback http_addr")
	}
	if c.Auth.Disabled {
		if len(c.Auth.TokenFiles) > 0 {
			return bad("auth.disabled", "auth is disabled but auth.token_files are set: choose one")
		}
		if !loopback(c.HTTPAddr) {
			return bad("auth.disabled", "authentication may be off only on a loopback http_addr (127.0.0.1:port, [::1]:port, localhost:port), not %q", c.HTTPAddr)
		}
	}
	if c.Auth.ReloadInterval <= 0 {
		return bad("auth.reload_interval", "must be > 0, got %v", c.Auth.ReloadInterval)
	}
	l := c.Limits
	if l.RequestsPerS < 0 || (l.RequestsPerS > 0 && l.Burst <= 0) {
		return bad("limits.requests_per_s", "want requests_per_s >= 0 (0: no limit) and burst > 0, got %g and %d", l.RequestsPerS, l.Burst)
	}
	if l.MaxBodyBytes <= 0 || l.MaxBatch <= 0 || l.MaxWait <= 0 {
		return bad("limits.max_body_bytes", "max_body_bytes, max_batch and max_wait must be > 0, got %d, %d, %v", l.MaxBodyBytes, l.MaxBatch, l.MaxWait)
	}
	if c.Redis.URL != "" {
		u, err := url.Parse(c.Redis.URL)
		if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
			return bad("redis.url", "want redis://[user:pass@]host:port[/db] or rediss://..., got a malformed URL")
		}
	}
	for i, r := range c.Storage.S3.Allow {
		if r.Bucket == "" {
			return bad(fmt.Sprintf("storage.s3.allow[%d].bucket", i), "must be set")
		}
	}
	if c.Storage.S3.Endpoint != "" && (c.secrets.S3AccessKey == "") != (c.secrets.S3SecretKey == "") {
		return bad("storage.s3.access_key_file", "the S3 access key and secret key go together")
	}
	if c.Uploads.Expiry < time.Second || c.Uploads.Expiry > 7*24*time.Hour {
		return bad("uploads.expiry", "must be in [1s, 168h] (S3's presign range), got %v", c.Uploads.Expiry)
	}
	if c.Uploads.MaxBytes <= 0 {
		return bad("uploads.max_bytes", "must be > 0, got %d", c.Uploads.MaxBytes)
	}
	if p := c.Uploads.Prefix; p != "" && !strings.HasSuffix(p, "/") {
		return bad("uploads.prefix", "%q: end it with / (it is a directory)", p)
	}
	return nil
}

// loopback reports whether addr listens on a loopback address only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// printConfig writes the effective configuration as YAML, then which
// secrets are set and where from, never their values.
func printConfig(w io.Writer, c Config) error {
	if c.Redis.URL != "" {
		if u, err := url.Parse(c.Redis.URL); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), "REDACTED")
				c.Redis.URL = u.String()
			}
		}
	}
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	fmt.Fprintln(w, "# secrets (values never printed):")
	for _, name := range []string{"redis password", "s3 access key", "s3 secret key", "signing key", "url key"} {
		src, ok := c.secrets.from[name]
		if !ok {
			src = "not set"
		} else {
			src = "<redacted> from " + src
		}
		fmt.Fprintf(w, "#   %s: %s\n", name, src)
	}
	return nil
}
