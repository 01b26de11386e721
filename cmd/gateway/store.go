package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/rmsgrad/rmsgrad/gateway"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// stores is what the storage section gives the gateway: the router whose
// allow-list jobs, uploads and downloads are checked against, the S3
// presigner, the file store behind /v1/files, and their readiness checks.
type stores struct {
	router    *storage.Router
	presigner gateway.Presigner
	files     *gateway.FileObjects
	checks    []gateway.Check
}

// openStores builds the stores of the storage section. None is fine: the
// gateway then checks jobs only against the payload schema (the workers
// still apply their allow-list) and signs no URLs.
func openStores(ctx context.Context, cfg Config) (*stores, error) {
	st := &stores{}
	if cfg.Storage.FileRoot == "" && cfg.Storage.S3.Endpoint == "" {
		return st, nil
	}
	st.router = storage.NewRouter()
	if root := cfg.Storage.FileRoot; root != "" {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, fmt.Errorf("config: storage.file_root: %w", err)
		}
		fs, err := file.New(root)
		if err != nil {
			return nil, fmt.Errorf("config: storage.file_root: %w", err)
		}
		st.router.Register("file", fs)
		key := cfg.secrets.URLKey
		if key == nil {
			if key, err = gateway.NewURLKey(); err != nil {
				return nil, err
			}
		}
		st.files = &gateway.FileObjects{Store: fs, Key: key, MaxBytes: cfg.Uploads.MaxBytes}
		st.checks = append(st.checks, gateway.Check{Name: "storage", Check: func(ctx context.Context) error {
			_, err := fs.Stat(ctx, storage.Ref{Scheme: "file", Key: filepath.Join(fs.Root(), ".rmsgrad-ping")})
			if errors.Is(err, storage.ErrNotFound) {
				return nil
			}
			return err
		}})
	}
	if c := cfg.Storage.S3; c.Endpoint != "" {
		sc := s3.Config{Endpoint: c.Endpoint, Region: c.Region, AccessKey: cfg.secrets.S3AccessKey,
			SecretKey: cfg.secrets.S3SecretKey, TLS: c.TLS, CAFile: c.CAFile}
		for _, a := range c.Allow {
			r := s3.AllowRule{Bucket: a.Bucket}
			if a.Prefix != "" {
				r.Prefixes = []string{a.Prefix}
			}
			sc.Allow = append(sc.Allow, r)
		}
		s3st, err := s3.New(ctx, sc)
		if err != nil {
			return nil, fmt.Errorf("config: storage.s3: %w", err)
		}
		st.router.Register("s3", s3st)
		mc, err := presignClient(cfg)
		if err != nil {
			return nil, err
		}
		st.presigner = gateway.NewS3Presigner(mc)
		for _, a := range c.Allow {
			st.checks = append(st.checks, gateway.Check{Name: "storage", Check: func(ctx context.Context) error {
				_, err := s3st.Stat(ctx, storage.Ref{Scheme: "s3", Bucket: a.Bucket, Key: a.Prefix + ".rmsgrad-ping"})
				if errors.Is(err, storage.ErrNotFound) {
					return nil
				}
				return err
			}})
		}
	}
	return st, nil
}

// presignClient is the minio-go client URLs are presigned with: it names
// presign_endpoint (or endpoint) and never makes a request (the region is
// given, so minio-go does not look it up).
func presignClient(cfg Config) (*minio.Client, error) {
	c := cfg.Storage.S3
	ep := c.PresignEndpoint
	if ep == "" {
		ep = c.Endpoint
	}
	opts := &minio.Options{Creds: credentials.NewStaticV4(cfg.secrets.S3AccessKey, cfg.secrets.S3SecretKey, ""),
		Secure: c.TLS, Region: c.Region}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("config: storage.s3.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("config: storage.s3.ca_file: no PEM certificates in it")
		}
		tr, err := minio.DefaultTransport(true)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
		opts.Transport = tr
	}
	mc, err := minio.New(ep, opts)
	if err != nil {
		return nil, fmt.Errorf("config: storage.s3.presign_endpoint: %w", err)
	}
	return mc, nil
}
