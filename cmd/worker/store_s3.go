package main

import (
	"context"
	"fmt"

	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// addS3 registers the S3 store of the storage.s3 section on rs.
func addS3(ctx context.Context, cfg Config, rs *routerStore) error {
	c := cfg.Storage.S3
	st, err := s3.New(ctx, s3Config(cfg))
	if err != nil {
		return fmt.Errorf("config: storage.s3: %w", err)
	}
	rs.r.Register("s3", st)
	rs.s3 = st
	for _, a := range c.Allow {
		rs.pings = append(rs.pings, func(ctx context.Context) error {
			_, err := st.Stat(ctx, storage.Ref{Scheme: "s3", Bucket: a.Bucket, Key: a.Prefix + ".rmsgrad-ping"})
			return err
		})
	}
	return nil
}

// s3Config is the s3.Config of the storage.s3 section.
func s3Config(cfg Config) s3.Config {
	c := cfg.Storage.S3
	sc := s3.Config{Endpoint: c.Endpoint, Region: c.Region, AccessKey: cfg.secrets.S3AccessKey,
		SecretKey: cfg.secrets.S3SecretKey, TLS: c.TLS, CAFile: c.CAFile, DisableFastPath: c.DisableFastPath,
		MultipartThreshold: c.MultipartThreshold, PartSize: c.PartSize,
		Backoff: storage.Backoff{Attempts: c.Backoff.Attempts, Base: c.Backoff.Base, Max: c.Backoff.Max}}
	for _, a := range c.Allow {
		r := s3.AllowRule{Bucket: a.Bucket, ReadOnly: a.ReadOnly}
		if a.Prefix != "" {
			r.Prefixes = []string{a.Prefix}
		}
		sc.Allow = append(sc.Allow, r)
	}
	return sc
}
