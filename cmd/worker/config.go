package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rmsgrad/rmsgrad/internal/cliflag"
	"github.com/rmsgrad/rmsgrad/internal/devstate"
	"github.com/rmsgrad/rmsgrad/internal/redisconf"
	"github.com/rmsgrad/rmsgrad/internal/secret"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage/s3"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// Config is the worker's configuration: configs/worker.yaml documents every
// key with its default. Precedence: defaults < file < environment < flags.
// Secrets are never read from the file, only from the environment or from
// files the config names, and never printed.
type Config struct {
	Worker      string         `yaml:"worker"`      // name in results and logs; default the hostname
	Backend     string         `yaml:"backend"`     // auto|cpu|metal|cuda
	Concurrency int            `yaml:"concurrency"` // asynq handler goroutines
	Procs       int            `yaml:"procs"`       // GOMAXPROCS; 0 = Go's default (the CPUs the process may use)
	Queues      map[string]int `yaml:"queues"`      // queue -> priority weight
	Shards      int            `yaml:"shards"`      // asynq queues per logical queue; 0 = as recorded in Redis
	Fetchers    int            `yaml:"fetchers"`    // asynq servers (fetch loops) per shard; 0 = 8 in all (jobs.AutoFetchLoops)
	StrictPrio  bool           `yaml:"strict_priority"`
	Shutdown    time.Duration  `yaml:"shutdown_timeout"` // SIGTERM: how long in-flight jobs may take
	RetryBase   time.Duration  `yaml:"retry_base"`
	RetryMax    time.Duration  `yaml:"retry_max"`
	HTTPAddr    string         `yaml:"http_addr"` // /metrics, /healthz, /readyz; "" disables
	LogLevel    string         `yaml:"log_level"` // debug|info|warn|error
	BudgetBytes int64          `yaml:"budget_bytes"`
	// PinReserveBytes is the pinned host memory a GPU backend (cuda)
	// reserves at start for its buffer pool: -1 is budget_bytes, 0 none.
	PinReserveBytes int64 `yaml:"pin_reserve_bytes"`
	// PinCacheBytes bounds the pin cache: the w tensors that jobs pinned
	// with w_sha256, kept after one job read and checked them; 0 keeps
	// none (pins are still checked).
	PinCacheBytes  int64         `yaml:"pin_cache_bytes"`
	Limits         LimitsConfig  `yaml:"limits"`
	Batch          BatchCfg      `yaml:"batch"`
	Redis          RedisConfig   `yaml:"redis"`
	Storage        StorageConfig `yaml:"storage"`
	SigningKeyFile string        `yaml:"signing_key_file"`
	Dev            DevConfig     `yaml:"dev"`

	// OutageHold is the longest a job waits at the readiness gate
	// (jobs.Gate) before going back to the queue.
	OutageHold time.Duration `yaml:"outage_hold"`

	secrets secrets
}

// LimitsConfig bounds one job.
type LimitsConfig struct {
	MaxElements int64 `yaml:"max_elements"`
	MaxJobBytes int64 `yaml:"max_job_bytes"`
	// MaxHeaderBytes bounds the safetensors JSON header of each input
	// object, read whole into memory.
	MaxHeaderBytes int64 `yaml:"max_header_bytes"`
	// HeaderBudgetBytes bounds the memory of the headers being read and
	// parsed at once (storage.WithHeaderBudget), beside budget_bytes.
	HeaderBudgetBytes int64 `yaml:"header_budget_bytes"`
}

// BatchCfg says when the batcher flushes.
type BatchCfg struct {
	MaxJobs  int           `yaml:"max_jobs"`
	MaxBytes int64         `yaml:"max_bytes"`
	MaxWait  time.Duration `yaml:"max_wait"`
}

// RedisConfig says how to reach Redis (one Redis, Sentinel or a Cluster).
type RedisConfig = redisconf.Config

// StorageConfig says which stores the worker may read and write.
type StorageConfig struct {
	FileRoot string   `yaml:"file_root"` // file:// URIs must lie under it; "" disables file://
	S3       S3Config `yaml:"s3"`
	// FileAllow, when set, limits file:// URIs to these prefixes under
	// FileRoot, each read-write or read-only (file.Rule); empty: the whole
	// root, read-write.
	FileAllow []FileRule `yaml:"file_allow"`
	// DisableSharedReads makes every job read its inputs' objects itself,
	// even when another job is reading the same object at that moment
	// (storage.WithSharedReads): for inputs overwritten while jobs run.
	DisableSharedReads bool `yaml:"disable_shared_reads"`
}

// S3Config is the S3 store; keys come from the environment or key files.
type S3Config struct {
	Endpoint      string      `yaml:"endpoint"` // host:port; "" disables s3://
	Region        string      `yaml:"region"`
	TLS           bool        `yaml:"tls"`
	CAFile        string      `yaml:"ca_file"`
	AccessKeyFile string      `yaml:"access_key_file"`
	SecretKeyFile string      `yaml:"secret_key_file"`
	Allow         []AllowRule `yaml:"allow"`
	// DisableFastPath sends every S3 request through minio-go and
	// net/http instead of the store's minimal HTTP/1.1 client
	// (s3.Config.DisableFastPath): for a server the fast path mishandles.
	DisableFastPath bool `yaml:"disable_fast_path"`
	// MultipartThreshold and PartSize (bytes; defaults 128 MiB and 16 MiB,
	// s3.DefaultMultipartThreshold and s3.DefaultPartSize): outputs up to
	// the threshold go up in one PUT, larger ones as a multipart upload of
	// PartSize parts (s3.Config).
	MultipartThreshold uint64 `yaml:"multipart_threshold"`
	PartSize           uint64 `yaml:"part_size"`
	// Backoff is the store's own retry of a failed request (storage.Backoff;
	// zero fields: 5 attempts, 100 ms, 5 s), before the job fails with
	// storage unavailable.
	Backoff BackoffConfig `yaml:"backoff"`
	// StaleUploadAge: multipart uploads under the writable allow-list
	// older than this are aborted, at start and every half of it (0: never;
	// cmd/worker/janitor.go).
	StaleUploadAge time.Duration `yaml:"stale_upload_age"`
}

// defaultBackoff is storage.DefaultBackoff.
var defaultBackoff = BackoffConfig{Attempts: 5, Base: 100 * time.Millisecond, Max: 5 * time.Second}

// BackoffConfig is storage.Backoff in the configuration.
type BackoffConfig struct {
	Attempts int           `yaml:"attempts"`
	Base     time.Duration `yaml:"base"`
	Max      time.Duration `yaml:"max"`
}

// FileRule opens a prefix under storage.file_root (relative to it, e.g.
// "in/"), for reading, and for writing unless read_only.
type FileRule struct {
	Prefix   string `yaml:"prefix"`
	ReadOnly bool   `yaml:"read_only"`
}

// AllowRule permits a bucket, optionally only under a key prefix, and
// only for reading when read_only.
type AllowRule struct {
	Bucket   string `yaml:"bucket"`
	Prefix   string `yaml:"prefix"`
	ReadOnly bool   `yaml:"read_only"`
}

// DevConfig is --dev: an embedded Redis and a local-disk store.
type DevConfig struct {
	Enabled   bool   `yaml:"enabled"`
	RedisAddr string `yaml:"redis_addr"`
	Dir       string `yaml:"dir"`
}

// secrets are kept out of the YAML on purpose.
type secrets struct {
	RedisPassword, S3AccessKey, S3SecretKey string
	SigningKey                              []byte
	from                                    map[string]string // secret -> where it came from
}

func defaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Worker: host, Backend: "auto", Concurrency: 64,
		Queues:   map[string]int{"rmsnorm": 1},
		Shutdown: 2 * time.Minute, RetryBase: time.Second, RetryMax: 5 * time.Minute, OutageHold: 30 * time.Second,
		HTTPAddr: "127.0.0.1:9464", LogLevel: "info",
		BudgetBytes: 2 << 30, PinReserveBytes: -1, PinCacheBytes: jobs.DefaultPinCacheBytes,
		Limits: LimitsConfig{MaxElements: 1 << 28, MaxJobBytes: 1 << 30, MaxHeaderBytes: 1 << 20, HeaderBudgetBytes: 64 << 20},
		Batch:  BatchCfg{MaxJobs: 32, MaxBytes: 256 << 20, MaxWait: 2 * time.Millisecond},
		Redis:  RedisConfig{Addr: "127.0.0.1:6379"},
		Storage: StorageConfig{S3: S3Config{Region: "us-east-1", TLS: true,
			MultipartThreshold: s3.DefaultMultipartThreshold, PartSize: s3.DefaultPartSize,
			StaleUploadAge: 6 * time.Hour, Backoff: defaultBackoff}},
		Dev: DevConfig{RedisAddr: "127.0.0.1:6390", Dir: devstate.DefaultDir},
	}
}

// usage heads the worker's --help.
const usage = `usage: worker [flags]

The rmsgrad queue worker: takes RMSNorm-backward jobs from Redis, computes
them in batches and stores the gradients. Settings come from the YAML file
(--config or RMSGRAD_CONFIG), then RMSGRAD_* variables, then these flags;
every key is in configs/worker.yaml and docs/configuration.md.
--print-config shows the configuration the worker would run with, every
default filled in (a flag below shows none: unset, it leaves the file's and
the environment's value alone).

  worker --dev                       one process, nothing installed
  worker --config /etc/rmsgrad/worker.yaml

flags:
`

// loadConfig builds the effective configuration from args and the
// environment. printOnly reports --print-config. --help writes the usage
// to stderr (loadConfigTo: to the stdout given) and returns flag.ErrHelp.
func loadConfig(args []string, getenv func(string) string, stderr io.Writer) (cfg Config, printOnly bool, err error) {
	return loadConfigTo(args, getenv, stderr, stderr)
}

// loadConfigTo is loadConfig with --help's usage going to stdout.
func loadConfigTo(args []string, getenv func(string) string, stdout, stderr io.Writer) (cfg Config, printOnly bool, err error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	path := fs.String("config", getenv("RMSGRAD_CONFIG"), "YAML config file (env RMSGRAD_CONFIG)")
	printCfg := fs.Bool("print-config", false, "print the effective configuration (secrets redacted) and exit")
	dev := fs.Bool("dev", false, "dev mode: embedded Redis and a local-disk store; nothing to install")
	redis := fs.String("redis", "", "Redis host:port, or a redis:// / rediss:// URL")
	redisCluster := fs.String("redis-cluster", "", "Redis Cluster seed nodes, host:port,host:port,...")
	shards := fs.Int("shards", 0, "shards per queue this worker expects (0: as recorded in Redis)")
	fetchers := fs.Int("fetchers", 0, "fetch loops (asynq servers) per shard, sharing concurrency (0: 8 in all, rounded up per shard)")
	backend := fs.String("backend", "", "compute backend: auto|cpu|metal|cuda")
	conc := fs.Int("concurrency", 0, "handler goroutines")
	procs := fs.Int("procs", 0, "GOMAXPROCS: threads running Go code at once (0: Go's default)")
	httpAddr := fs.String("http", "", "listen address of /metrics, /healthz, /readyz")
	devRedis := fs.String("dev-redis", "", "dev mode: embedded Redis address (port 0: any free port)")
	devDir := fs.String("dev-dir", "", "dev mode: data directory (the file store's root; enqueue finds the worker through its dev.json)")
	fileRoot := fs.String("file-root", "", "root of file:// tensors")
	logLevel := fs.String("log-level", "", "debug|info|warn|error")
	if err := cliflag.Parse(fs, args, stdout, stderr); err != nil {
		return cfg, false, err
	}
	if fs.NArg() > 0 {
		return cfg, false, cliflag.Usagef("unexpected arguments %q (every setting is a --flag; see worker --help)", fs.Args())
	}
	cfg = defaultConfig()
	if *path != "" {
		b, err := os.ReadFile(*path)
		if err != nil {
			return cfg, false, fmt.Errorf("config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true) // a misspelt key fails, naming it
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
			return cfg, false, fmt.Errorf("config %s: %w", *path, err)
		}
	}
	if err := applyEnv(&cfg, getenv); err != nil {
		return cfg, false, err
	}
	// Flags last: only the ones given.
	var ferr error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "dev":
			cfg.Dev.Enabled = *dev
		case "redis":
			if strings.Contains(*redis, "://") {
				cfg.Redis.URL = *redis
			} else {
				cfg.Redis.Addr = *redis
			}
		case "redis-cluster":
			cfg.Redis.ClusterAddrs = redisconf.SplitAddrs(*redisCluster)
		case "shards":
			cfg.Shards = *shards
		case "fetchers":
			cfg.Fetchers = *fetchers
		case "backend":
			cfg.Backend = *backend
		case "concurrency":
			cfg.Concurrency = *conc
		case "procs":
			cfg.Procs = *procs
		case "http":
			cfg.HTTPAddr = *httpAddr
		case "dev-redis":
			cfg.Dev.RedisAddr = *devRedis
		case "dev-dir":
			cfg.Dev.Dir = *devDir
		case "file-root":
			cfg.Storage.FileRoot = *fileRoot
		case "log-level":
			cfg.LogLevel = *logLevel
		}
	})
	if ferr != nil {
		return cfg, false, ferr
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
	{"RMSGRAD_WORKER", "worker"}, {"RMSGRAD_BACKEND", "backend"}, {"RMSGRAD_CONCURRENCY", "concurrency"},
	{"RMSGRAD_PROCS", "procs"},
	{"RMSGRAD_SHUTDOWN_TIMEOUT", "shutdown_timeout"}, {"RMSGRAD_HTTP_ADDR", "http_addr"}, {"RMSGRAD_LOG_LEVEL", "log_level"},
	{"RMSGRAD_BUDGET_BYTES", "budget_bytes"}, {"RMSGRAD_PIN_RESERVE_BYTES", "pin_reserve_bytes"}, {"RMSGRAD_PIN_CACHE_BYTES", "pin_cache_bytes"}, {"RMSGRAD_REDIS_ADDR", "redis.addr"}, {"RMSGRAD_REDIS_URL", "redis.url"},
	{"RMSGRAD_REDIS_DB", "redis.db"}, {"RMSGRAD_REDIS_USERNAME", "redis.username"}, {"RMSGRAD_FILE_ROOT", "storage.file_root"},
	{"RMSGRAD_S3_ENDPOINT", "storage.s3.endpoint"}, {"RMSGRAD_S3_REGION", "storage.s3.region"},
	{"RMSGRAD_BATCH_MAX_JOBS", "batch.max_jobs"}, {"RMSGRAD_BATCH_MAX_WAIT", "batch.max_wait"},
	{"RMSGRAD_DEV_REDIS_ADDR", "dev.redis_addr"}, {"RMSGRAD_DEV_DIR", "dev.dir"},
	{"RMSGRAD_REDIS_CLUSTER_ADDRS", "redis.cluster_addrs"}, {"RMSGRAD_SHARDS", "shards"},
	{"RMSGRAD_FETCHERS", "fetchers"},
}

func applyEnv(cfg *Config, getenv func(string) string) error {
	for _, e := range envVars {
		v := getenv(e.env)
		if v == "" {
			continue
		}
		var err error
		switch e.key {
		case "worker":
			cfg.Worker = v
		case "backend":
			cfg.Backend = v
		case "concurrency":
			cfg.Concurrency, err = strconv.Atoi(v)
		case "procs":
			cfg.Procs, err = strconv.Atoi(v)
		case "shutdown_timeout":
			cfg.Shutdown, err = time.ParseDuration(v)
		case "http_addr":
			cfg.HTTPAddr = v
		case "log_level":
			cfg.LogLevel = v
		case "budget_bytes":
			cfg.BudgetBytes, err = strconv.ParseInt(v, 10, 64)
		case "pin_reserve_bytes":
			cfg.PinReserveBytes, err = strconv.ParseInt(v, 10, 64)
		case "pin_cache_bytes":
			cfg.PinCacheBytes, err = strconv.ParseInt(v, 10, 64)
		case "redis.addr":
			cfg.Redis.Addr = v
		case "redis.url":
			cfg.Redis.URL = v
		case "redis.db":
			cfg.Redis.DB, err = strconv.Atoi(v)
		case "redis.username":
			cfg.Redis.Username = v
		case "storage.file_root":
			cfg.Storage.FileRoot = v
		case "storage.s3.endpoint":
			cfg.Storage.S3.Endpoint = v
		case "storage.s3.region":
			cfg.Storage.S3.Region = v
		case "batch.max_jobs":
			cfg.Batch.MaxJobs, err = strconv.Atoi(v)
		case "batch.max_wait":
			cfg.Batch.MaxWait, err = time.ParseDuration(v)
		case "dev.redis_addr":
			cfg.Dev.RedisAddr = v
		case "dev.dir":
			cfg.Dev.Dir = v
		case "redis.cluster_addrs":
			cfg.Redis.ClusterAddrs = redisconf.SplitAddrs(v)
		case "shards":
			cfg.Shards, err = strconv.Atoi(v)
		case "fetchers":
			cfg.Fetchers, err = strconv.Atoi(v)
		}
		if err != nil {
			return fmt.Errorf("config: %s (from %s=%q): %w", e.key, e.env, v, err)
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
	return nil
}

// keyName is a key as messages show it: with its environment variable
// when it has one, e.g. "budget_bytes (RMSGRAD_BUDGET_BYTES)".
func keyName(key string) string {
	for _, e := range envVars {
		if e.key == key {
			return key + " (" + e.env + ")"
		}
	}
	return key
}

func (c *Config) validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("config: %s: %s", keyName(key), fmt.Sprintf(format, args...))
	}
	switch c.Backend {
	case "auto", "cpu", "metal", "cuda":
	default:
		return bad("backend", "%q is not one of auto, cpu, metal, cuda", c.Backend)
	}
	if c.Concurrency <= 0 {
		return bad("concurrency", "must be > 0, got %d", c.Concurrency)
	}
	if c.Procs < 0 {
		return bad("procs", "must be >= 0 (0: Go's default), got %d", c.Procs)
	}
	if len(c.Queues) == 0 {
		return bad("queues", "at least one queue is needed")
	}
	for q, p := range c.Queues {
		if q == "" || p <= 0 {
			return bad("queues", "queue %q: priority must be > 0, got %d", q, p)
		}
		if err := jobs.ValidateQueueName(q); err != nil {
			return bad("queues", "%v", err)
		}
	}
	if c.Shutdown <= 0 {
		return bad("shutdown_timeout", "must be > 0, got %v", c.Shutdown)
	}
	if c.RetryBase <= 0 || c.RetryMax < c.RetryBase {
		return bad("retry_base", "want 0 < retry_base <= retry_max, got %v and %v", c.RetryBase, c.RetryMax)
	}
	if c.OutageHold <= 0 {
		return bad("outage_hold", "must be > 0, got %v", c.OutageHold)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return bad("log_level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	if c.BudgetBytes <= 0 {
		return bad("budget_bytes", "must be > 0, got %d", c.BudgetBytes)
	}
	if c.PinReserveBytes < -1 {
		return bad("pin_reserve_bytes", "must be -1 (budget_bytes), 0 (none) or a byte count, got %d", c.PinReserveBytes)
	}
	if c.PinCacheBytes < 0 {
		return bad("pin_cache_bytes", "must be 0 (keep no pinned w) or a byte count, got %d", c.PinCacheBytes)
	}
	if c.Limits.MaxElements <= 0 || c.Limits.MaxElements > 1<<31-1 {
		return bad("limits.max_elements", "must be in 1..%d, got %d", 1<<31-1, c.Limits.MaxElements)
	}
	if c.Limits.MaxJobBytes <= 0 {
		return bad("limits.max_job_bytes", "must be > 0, got %d", c.Limits.MaxJobBytes)
	}
	if c.Limits.MaxHeaderBytes <= 0 || c.Limits.MaxHeaderBytes > 100_000_000 {
		return bad("limits.max_header_bytes", "must be in 1..100000000 (the safetensors cap), got %d", c.Limits.MaxHeaderBytes)
	}
	if need := safetensors.ParseCost(c.Limits.MaxHeaderBytes); c.Limits.HeaderBudgetBytes < need {
		return bad("limits.header_budget_bytes", "%d is too small for limits.max_header_bytes %d: reading and parsing one such header takes up to %d bytes", c.Limits.HeaderBudgetBytes, c.Limits.MaxHeaderBytes, need)
	}
	if c.Batch.MaxJobs <= 0 {
		return bad("batch.max_jobs", "must be > 0, got %d", c.Batch.MaxJobs)
	}
	if c.Batch.MaxBytes <= 0 {
		return bad("batch.max_bytes", "must be > 0, got %d", c.Batch.MaxBytes)
	}
	if c.Batch.MaxWait <= 0 || c.Batch.MaxWait > time.Minute {
		return bad("batch.max_wait", "must be in (0, 1m], got %v", c.Batch.MaxWait)
	}
	if c.Redis.URL != "" {
		u, err := url.Parse(c.Redis.URL)
		if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
			return bad("redis.url", "want redis://[user:pass@]host:port[/db] or rediss://..., got a malformed URL")
		}
	}
	if err := c.Redis.Validate(); err != nil {
		return err
	}
	if c.Shards < 0 {
		return bad("shards", "must be >= 0 (0: as recorded in Redis), got %d", c.Shards)
	}
	if c.Fetchers < 0 || c.Fetchers > c.Concurrency {
		return bad("fetchers", "must be in 0..concurrency (%d) (0: 8 fetch loops in all), got %d", c.Concurrency, c.Fetchers)
	}
	if c.Dev.Enabled && c.Dev.RedisAddr == "" {
		return bad("dev.redis_addr", "must be set in dev mode")
	}
	if c.Dev.Enabled && c.Dev.Dir == "" {
		return bad("dev.dir", "must be set in dev mode")
	}
	if b := c.Storage.S3.Backoff; b.Attempts <= 0 || b.Base <= 0 || b.Max < b.Base {
		return bad("storage.s3.backoff", "want attempts > 0 and 0 < base <= max, got %d, %v, %v", b.Attempts, b.Base, b.Max)
	}
	if c.Storage.S3.StaleUploadAge < 0 || (c.Storage.S3.StaleUploadAge > 0 && c.Storage.S3.StaleUploadAge < time.Second) {
		return bad("storage.s3.stale_upload_age", "want 0 (never) or at least 1s, got %v", c.Storage.S3.StaleUploadAge)
	}
	for i, r := range c.Storage.FileAllow {
		if r.Prefix == "" || strings.HasPrefix(r.Prefix, "/") {
			return bad(fmt.Sprintf("storage.file_allow[%d].prefix", i), "want a path relative to storage.file_root, such as \"out/\", got %q", r.Prefix)
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
	return nil
}

// printConfig writes the effective configuration as YAML: every default
// filled in, and in dev mode what dev mode changes (the embedded Redis,
// the dev directory as the file root, cpu for auto). Then which secrets
// are set and where from, never their values.
func printConfig(w io.Writer, c Config) error {
	if c.Dev.Enabled {
		if err := applyDev(&c); err != nil {
			return err
		}
		port0 := ""
		if strings.HasSuffix(c.Dev.RedisAddr, ":0") {
			port0 = "; port 0: a free port chosen at start"
		}
		fmt.Fprintf(w, "# dev mode: redis.addr is the worker's embedded Redis-protocol server (dev.redis_addr%s),\n", port0)
		fmt.Fprintf(w, "# storage.file_root is dev.dir; while the worker runs, %s tells enqueue both.\n", devstate.Path(c.Storage.FileRoot))
	}
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
	if c.Procs == 0 {
		fmt.Fprintf(w, "# procs 0: Go's default, GOMAXPROCS %d here (%d with the cuda backend)\n", runtime.GOMAXPROCS(0), gpuHostProcs(runtime.GOMAXPROCS(0)))
	}
	fmt.Fprintln(w, "# secrets (values never printed):")
	for _, name := range []string{"redis password", "s3 access key", "s3 secret key", "signing key"} {
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

// pinReserve is the pinned host memory to reserve at start:
// pin_reserve_bytes, or budget_bytes for -1.
func (c *Config) pinReserve() int64 {
	if c.PinReserveBytes < 0 {
		return c.BudgetBytes
	}
	return c.PinReserveBytes
}

// warnBudget logs a warning when budget_bytes is below
// limits.max_job_bytes: jobs between the two pass the limit but can never
// get their buffers, so they fail as permanent errors (naming
// budget_bytes). Not an error: a worker may be sized for small jobs on
// purpose.
func warnBudget(c Config, log *slog.Logger) {
	if c.Limits.MaxJobBytes > c.BudgetBytes {
		log.Warn("budget_bytes is below limits.max_job_bytes: jobs larger than the budget fail as permanent errors although within the limit",
			"budget_bytes", c.BudgetBytes, "max_job_bytes", c.Limits.MaxJobBytes)
	}
}
