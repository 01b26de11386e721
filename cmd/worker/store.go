package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/rmsgrad/rmsgrad/internal/jobstore"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// routerStore is the worker's jobs.Store: the router behind the shared
// adapter, with a Ping over the stores configured.
type routerStore struct {
	jobstore.Store
	r     *storage.Router
	pings []func(context.Context) error
	s3    *s3.Store // nil: no S3 store configured
}

// Ping checks each configured store answers: a missing object is an answer.
func (s *routerStore) Ping(ctx context.Context) error {
	var errs []error
	for _, p := range s.pings {
		if err := p(ctx); err != nil && !errors.Is(err, storage.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// openStore builds the router from the storage section: the file store when
// file_root is set, S3 when an endpoint is. No store at all is a config
// error: the worker could not read a single tensor.
func openStore(ctx context.Context, cfg Config) (*routerStore, error) {
	r := storage.NewRouter(storage.WithMaxHeaderBytes(cfg.Limits.MaxHeaderBytes), storage.WithHeaderBudget(cfg.Limits.HeaderBudgetBytes),
		storage.WithSharedReads(!cfg.Storage.DisableSharedReads))
	rs := &routerStore{Store: jobstore.Store{R: r}, r: r}
	if root := cfg.Storage.FileRoot; root != "" {
		var rules []file.Rule
		for _, r := range cfg.Storage.FileAllow {
			rules = append(rules, file.Rule{Prefix: r.Prefix, ReadOnly: r.ReadOnly})
		}
		fs, err := file.New(root, rules...)
		if err != nil {
			return nil, fmt.Errorf("config: %s: %w", keyName("storage.file_root"), err)
		}
		rs.r.Register("file", fs)
		rs.pings = append(rs.pings, func(ctx context.Context) error {
			_, err := fs.Stat(ctx, storage.Ref{Scheme: "file", Key: filepath.Join(root, ".rmsgrad-ping")})
			return err
		})
	}
	if cfg.Storage.S3.Endpoint != "" {
		if err := addS3(ctx, cfg, rs); err != nil {
			return nil, err
		}
	}
	if len(rs.pings) == 0 {
		return nil, errors.New("config: storage: neither storage.file_root (RMSGRAD_FILE_ROOT, --file-root) nor storage.s3.endpoint (RMSGRAD_S3_ENDPOINT) is set: the worker could read no tensor (or run worker --dev)")
	}
	return rs, nil
}
