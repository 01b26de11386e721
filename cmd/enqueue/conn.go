package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// pingTimeout bounds the check that Redis answers (go-redis's own dial
// and read timeouts, 5 s and 3 s, bound each attempt within it).
const pingTimeout = 10 * time.Second

// openClient connects to Redis and checks that it answers, so that an
// unreachable Redis is one clear error (naming the address and where it was
// configured) before anything is uploaded or waited for.
func openClient(c config) (*jobs.Client, error) {
	opt, err := c.redisOpt()
	if err != nil {
		return nil, err
	}
	opts := []jobs.ClientOption{jobs.WithQueue(c.Queue), jobs.WithRetention(c.Retention),
		jobs.WithMaxRetry(c.MaxRetry), jobs.WithTimeout(c.Timeout), jobs.WithShards(c.Shards)}
	if c.signingKey != nil {
		opts = append(opts, jobs.WithSigningKey(c.signingKey))
	}
	client := jobs.NewClient(opt, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	if err := client.Ping(ctx); err != nil {
		client.Close()
		if c.dev != nil {
			return nil, fmt.Errorf("cannot reach Redis at %s (from %s: is that dev worker, pid %d, still running? start it again with worker --dev, or set --redis, RMSGRAD_REDIS_ADDR or %s): %w",
				c.redisShown(), c.redisFrom, c.dev.PID, c.configHint(), err)
		}
		return nil, fmt.Errorf("cannot reach Redis at %s (from %s; set --redis, RMSGRAD_REDIS_ADDR or %s, or start worker --dev in this directory): %w",
			c.redisShown(), c.redisFrom, c.configHint(), err)
	}
	return client, nil
}

// openStorage builds the router the CLI uploads inputs and reads outputs
// through: the file store when a root is set, S3 when an endpoint is.
func openStorage(ctx context.Context, c config) (*storage.Router, error) {
	r := storage.NewRouter()
	if c.Storage.FileRoot != "" {
		fs, err := file.New(c.Storage.FileRoot)
		if err != nil {
			return nil, fmt.Errorf("config: storage.file_root (RMSGRAD_FILE_ROOT, --root): %w", err)
		}
		r.Register("file", fs)
	}
	if c.Storage.S3.Endpoint != "" {
		cfg := s3.Config{
			Endpoint:  c.Storage.S3.Endpoint,
			Region:    c.Storage.S3.Region,
			AccessKey: c.Storage.accessKey,
			SecretKey: c.Storage.secretKey,
			TLS:       c.Storage.S3.TLS,
			CAFile:    c.Storage.S3.CAFile,
		}
		for _, b := range c.Storage.S3.Buckets {
			cfg.Allow = append(cfg.Allow, s3.AllowRule{Bucket: b})
		}
		st, err := s3.New(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("config: storage.s3: %w", err)
		}
		r.Register("s3", st)
	}
	return r, nil
}

// noteConnection tells the user on stderr, before jobs go out, what would
// otherwise look like a job that never runs: Redis taken from the bare
// default (no flag, variable, config file or dev worker set it), or no
// worker serving the queue on that Redis right now.
func noteConnection(stderr io.Writer, c config) {
	if c.redisFrom == "the default" {
		fmt.Fprintf(stderr, "enqueue: using Redis at %s, the default: no --redis, RMSGRAD_REDIS_ADDR, config file or dev worker (./rmsgrad-dev/dev.json) names one\n", c.redisShown())
	}
	opt, err := c.redisOpt()
	if err != nil {
		return
	}
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	servers, err := insp.Servers()
	if err != nil {
		return
	}
	for _, s := range servers {
		if _, ok := s.Queues[c.Queue]; ok {
			return
		}
	}
	fmt.Fprintf(stderr, "enqueue: note: no worker serves queue %q on Redis %s (from %s) right now; jobs wait there until one starts\n", c.Queue, c.redisShown(), c.redisFrom)
}
