package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"gopkg.in/yaml.v3"

	"github.com/rmsgrad/rmsgrad/internal/devstate"
	"github.com/rmsgrad/rmsgrad/internal/redisconf"
	"github.com/rmsgrad/rmsgrad/jobs"
)

// config is the CLI's connection settings. Precedence: flags, then
// environment, then the YAML file (--config, default configs/enqueue.yaml
// when present), then defaults. A dev worker's state file (internal/devstate)
// supplies redis.addr, storage.file_root and storage.upload_prefix: when
// named by --dev-dir or RMSGRAD_DEV_DIR, over the file and the environment;
// found in ./rmsgrad-dev, only when no Redis address is set anywhere.
// Secrets come only from the environment or from files named in the
// config, never from flags or the YAML itself.
type config struct {
	Redis struct {
		// Addr is host:port, or a redis:// or rediss:// URL.
		Addr     string `yaml:"addr"`
		DB       int    `yaml:"db"`
		Username string `yaml:"username"`
		// PasswordFile names a file holding the password; the password
		// itself comes from RMSGRAD_REDIS_PASSWORD or this file.
		PasswordFile string `yaml:"password_file"`
		TLS          bool   `yaml:"tls"`
		// ClusterAddrs are seed nodes of a Redis Cluster (host:port);
		// when set they replace addr.
		ClusterAddrs []string `yaml:"cluster_addrs"`
	} `yaml:"redis"`
	Queue string `yaml:"queue"`
	// Shards is the shard count the CLI expects the queue to have; 0
	// follows the count recorded in Redis.
	Shards    int           `yaml:"shards"`
	Retention time.Duration `yaml:"retention"`
	MaxRetry  int           `yaml:"max_retry"`
	Timeout   time.Duration `yaml:"timeout"`
	Storage   storageConfig `yaml:"storage"`
	// SigningKeyFile names a file with the HMAC key (or RMSGRAD_SIGNING_KEY).
	SigningKeyFile string `yaml:"signing_key_file"`

	password   string
	signingKey []byte
	redisFrom  string // where redis.addr came from, for error messages
	file       string // the config file read, "" when none
	// dev is the dev worker's state when redis.addr came from it.
	dev *devstate.State
}

type storageConfig struct {
	// FileRoot is the directory file:// URIs must stay inside.
	FileRoot string `yaml:"file_root"`
	S3       struct {
		Endpoint string `yaml:"endpoint"`
		Region   string `yaml:"region"`
		TLS      bool   `yaml:"tls"`
		CAFile   string `yaml:"ca_file"`
		// Buckets the CLI may upload to (and read results from).
		Buckets []string `yaml:"buckets"`
		// Credentials come from RMSGRAD_S3_ACCESS_KEY / RMSGRAD_S3_SECRET_KEY.
	} `yaml:"s3"`
	// UploadPrefix is where local files given to submit are uploaded:
	// s3://bucket/prefix/ or file:///dir/.
	UploadPrefix string `yaml:"upload_prefix"`

	accessKey, secretKey string
}

func defaultConfig() config {
	var c config
	c.Redis.Addr = "127.0.0.1:6379"
	c.Queue = "rmsnorm"
	c.Retention = 24 * time.Hour
	c.MaxRetry = 10
	c.Timeout = 10 * time.Minute
	c.Storage.S3.Region = "us-east-1"
	c.Storage.S3.TLS = true // as the worker's: plain HTTP to S3 must be asked for
	return c
}

// connFlags are the flags every subcommand shares.
type connFlags struct {
	configPath, redis, cluster, queue, root, uploadPrefix, devDir string
	shards                                                        optInt
	json                                                          bool
}

// optInt is an int flag that knows whether it was given.
type optInt struct {
	v   int
	set bool
}

func (o *optInt) String() string {
	if o == nil || !o.set {
		return ""
	}
	return strconv.Itoa(o.v)
}

func (o *optInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return err
	}
	o.v, o.set = n, true
	return nil
}

func (f *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.configPath, "config", "", "YAML config file (default configs/enqueue.yaml if present)")
	fs.StringVar(&f.redis, "redis", "", "Redis address host:port or redis[s]:// URL (env RMSGRAD_REDIS_ADDR)")
	fs.StringVar(&f.cluster, "redis-cluster", "", "Redis Cluster seed nodes host:port,host:port,... (env RMSGRAD_REDIS_CLUSTER_ADDRS)")
	fs.StringVar(&f.queue, "queue", "", "queue name (env RMSGRAD_QUEUE; default rmsnorm)")
	fs.Var(&f.shards, "shards", "`N` shards expected of the queue; 0 (the default) follows the count recorded in Redis (env RMSGRAD_SHARDS)")
	fs.StringVar(&f.root, "root", "", "file store root for file:// URIs (env RMSGRAD_FILE_ROOT)")
	fs.StringVar(&f.uploadPrefix, "upload-prefix", "", "where local files are uploaded: s3://bucket/prefix/ or file:///dir/ (env RMSGRAD_UPLOAD_PREFIX)")
	fs.StringVar(&f.devDir, "dev-dir", "", "use the dev worker (worker --dev) of this directory: its Redis and file root (env RMSGRAD_DEV_DIR; ./rmsgrad-dev is looked at when no Redis address is set)")
	fs.BoolVar(&f.json, "json", false, "print machine-readable JSON")
}

// configHint says where redis.addr can be set, naming the config file
// actually read.
func (c *config) configHint() string {
	if c.file != "" {
		return "redis.addr in " + c.file
	}
	return "redis.addr in a config file (--config, RMSGRAD_ENQUEUE_CONFIG, else ./configs/enqueue.yaml)"
}

func loadConfig(f *connFlags) (config, error) {
	c := defaultConfig()
	path := f.configPath
	if path == "" {
		path = os.Getenv("RMSGRAD_ENQUEUE_CONFIG")
	}
	explicit := path != ""
	if path == "" {
		path = "configs/enqueue.yaml"
	}
	c.redisFrom = "the default"
	// Which of the keys a dev worker can supply the file sets.
	var set struct {
		Redis struct {
			Addr *string `yaml:"addr"`
		} `yaml:"redis"`
		Storage struct {
			FileRoot     *string `yaml:"file_root"`
			UploadPrefix *string `yaml:"upload_prefix"`
		} `yaml:"storage"`
	}
	if b, err := os.ReadFile(path); err == nil {
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			return c, fmt.Errorf("config %s: %w", path, err)
		}
		_ = yaml.Unmarshal(b, &set)
		c.file = path
		if set.Redis.Addr != nil {
			c.redisFrom = "redis.addr in " + path
		}
		if len(c.Redis.ClusterAddrs) > 0 {
			c.redisFrom = "redis.cluster_addrs in " + path
		}
	} else if explicit {
		return c, fmt.Errorf("config: %w", err)
	}
	env := func(k string, dst *string) {
		if v := os.Getenv(k); v != "" {
			*dst = v
		}
	}
	if os.Getenv("RMSGRAD_REDIS_ADDR") != "" {
		c.redisFrom = "env RMSGRAD_REDIS_ADDR"
	}
	if f.redis != "" {
		c.redisFrom = "flag --redis"
	}
	if v := os.Getenv("RMSGRAD_REDIS_CLUSTER_ADDRS"); v != "" {
		c.Redis.ClusterAddrs, c.redisFrom = redisconf.SplitAddrs(v), "env RMSGRAD_REDIS_CLUSTER_ADDRS"
	}
	if f.cluster != "" {
		c.Redis.ClusterAddrs, c.redisFrom = redisconf.SplitAddrs(f.cluster), "flag --redis-cluster"
	}
	if len(c.Redis.ClusterAddrs) == 0 {
		c.Redis.ClusterAddrs = nil // "cluster_addrs: []" is no cluster
	}
	if v := os.Getenv("RMSGRAD_SHARDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return c, fmt.Errorf("config: shards (from RMSGRAD_SHARDS=%q): %w", v, err)
		}
		c.Shards = n
	}
	if f.shards.set {
		c.Shards = f.shards.v
	}
	env("RMSGRAD_REDIS_ADDR", &c.Redis.Addr)
	env("RMSGRAD_REDIS_USERNAME", &c.Redis.Username)
	env("RMSGRAD_QUEUE", &c.Queue)
	env("RMSGRAD_FILE_ROOT", &c.Storage.FileRoot)
	env("RMSGRAD_UPLOAD_PREFIX", &c.Storage.UploadPrefix)
	env("RMSGRAD_S3_ENDPOINT", &c.Storage.S3.Endpoint)
	// A dev worker: named by --dev-dir or RMSGRAD_DEV_DIR, it supplies
	// Redis and the file root over the file and the environment; found in
	// ./rmsgrad-dev, only what nothing else sets.
	explicitDev := f.devDir != "" || os.Getenv(devstate.EnvDir) != ""
	addrSet := set.Redis.Addr != nil || os.Getenv("RMSGRAD_REDIS_ADDR") != ""
	if f.redis == "" && (explicitDev || !addrSet) {
		dir := devstate.Dir(f.devDir, os.Getenv)
		st, err := devstate.Read(dir)
		switch {
		case err == nil:
			c.dev = &st
			c.Redis.Addr = st.RedisAddr
			c.redisFrom = "the dev worker's state file " + devstate.Path(dir)
			if explicitDev || (set.Storage.FileRoot == nil && os.Getenv("RMSGRAD_FILE_ROOT") == "") {
				c.Storage.FileRoot = st.FileRoot
			}
			if explicitDev || (set.Storage.UploadPrefix == nil && os.Getenv("RMSGRAD_UPLOAD_PREFIX") == "") {
				// Local files elsewhere are copied into the dev store.
				c.Storage.UploadPrefix = "file://" + filepath.Join(st.FileRoot, "uploads") + "/"
			}
		case explicitDev && errors.Is(err, os.ErrNotExist):
			return c, fmt.Errorf("no dev worker in %s (no %s: it is written by worker --dev --dev-dir %s while it runs, and removed when it stops)",
				dir, devstate.FileName, dir)
		case !errors.Is(err, os.ErrNotExist):
			return c, fmt.Errorf("dev worker state: %w", err)
		}
	}
	for _, kv := range []struct {
		flag string
		dst  *string
	}{{f.redis, &c.Redis.Addr}, {f.queue, &c.Queue}, {f.root, &c.Storage.FileRoot}, {f.uploadPrefix, &c.Storage.UploadPrefix}} {
		if kv.flag != "" {
			*kv.dst = kv.flag
		}
	}
	var err error
	if c.password, err = secret("RMSGRAD_REDIS_PASSWORD", c.Redis.PasswordFile, "redis.password_file"); err != nil {
		return c, err
	}
	key, err := secret("RMSGRAD_SIGNING_KEY", c.SigningKeyFile, "signing_key_file")
	if err != nil {
		return c, err
	}
	if key != "" {
		c.signingKey = []byte(key)
	}
	c.Storage.accessKey = os.Getenv("RMSGRAD_S3_ACCESS_KEY")
	c.Storage.secretKey = os.Getenv("RMSGRAD_S3_SECRET_KEY")
	if err := jobs.ValidateQueueName(c.Queue); err != nil {
		return c, fmt.Errorf("config: queue: %w", err)
	}
	if c.Shards < 0 {
		return c, fmt.Errorf("config: shards: must be >= 0 (0: as recorded in Redis), got %d", c.Shards)
	}
	if len(c.Redis.ClusterAddrs) > 0 && c.Redis.DB != 0 {
		return c, fmt.Errorf("config: redis.db: a Redis Cluster has only database 0, got %d", c.Redis.DB)
	}
	if c.Retention <= 0 {
		return c, fmt.Errorf("config: retention: must be > 0, got %v (asynq deletes a result at once without it, and wait could not read it)", c.Retention)
	}
	if c.MaxRetry < 0 || c.Timeout <= 0 {
		return c, fmt.Errorf("config: max_retry must be >= 0 and timeout > 0, got %d and %v", c.MaxRetry, c.Timeout)
	}
	return c, nil
}

// secret reads a secret from an environment variable or, failing that, a
// file. The error names the key, never the value.
func secret(envVar, file, key string) (string, error) {
	if v := os.Getenv(envVar); v != "" {
		return v, nil
	}
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("config: %s: %w", key, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// redisShown is the Redis address as errors show it: a URL's password is
// redacted.
func (c *config) redisShown() string {
	if len(c.Redis.ClusterAddrs) > 0 {
		return "cluster " + strings.Join(c.Redis.ClusterAddrs, ",")
	}
	if u, err := url.Parse(c.Redis.Addr); err == nil && u.User != nil {
		return u.Redacted()
	}
	return c.Redis.Addr
}

// redisOpt turns the Redis settings into asynq's connection option.
func (c *config) redisOpt() (asynq.RedisConnOpt, error) {
	if len(c.Redis.ClusterAddrs) > 0 {
		o := jobs.ClusterOpt{RedisClusterClientOpt: asynq.RedisClusterClientOpt{Addrs: c.Redis.ClusterAddrs,
			Username: c.Redis.Username, Password: c.password}}
		if c.Redis.TLS {
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		return o, nil
	}
	addr := c.Redis.Addr
	if strings.HasPrefix(addr, "redis://") || strings.HasPrefix(addr, "rediss://") {
		opt, err := asynq.ParseRedisURI(addr)
		if err != nil {
			return nil, fmt.Errorf("config: redis.addr: %w", err)
		}
		if o, ok := opt.(asynq.RedisClientOpt); ok {
			if c.password != "" {
				o.Password = c.password
			}
			// asynq's parser drops the URL's user name (ACL user).
			if u, err := url.Parse(addr); err == nil && u.User != nil {
				o.Username = u.User.Username()
			}
			if c.Redis.Username != "" {
				o.Username = c.Redis.Username
			}
			if o.TLSConfig != nil {
				o.TLSConfig.MinVersion = tls.VersionTLS12
			}
			return o, nil
		}
		return opt, nil
	}
	o := asynq.RedisClientOpt{Addr: addr, DB: c.Redis.DB, Username: c.Redis.Username, Password: c.password}
	if c.Redis.TLS {
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return o, nil
}
