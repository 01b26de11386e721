package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
)

// routerStore adapts *storage.Router to the jobs.Store the handler needs.
type routerStore struct {
	r       *storage.Router
	schemes []string
	pings   []func(context.Context) error
}

func (s *routerStore) Check(uri string, write bool) error { return s.r.Check(uri, write) }

func (s *routerStore) Head(ctx context.Context, uri string) (jobs.TensorInfo, error) {
	t, err := s.r.Head(ctx, uri)
	if err != nil {
		return jobs.TensorInfo{}, err
	}
	return jobs.TensorInfo{URI: uri, DType: t.DType, Shape: t.Shape, Size: t.Size, Local: t.Inline(), Handle: t}, nil
}

func (s *routerStore) Fetch(ctx context.Context, t jobs.TensorInfo, dst []byte) error {
	ti, ok := t.Handle.(storage.TensorInfo)
	if !ok {
		return fmt.Errorf("fetch %s: tensor info did not come from this store", t.URI)
	}
	return s.r.Fetch(ctx, ti, dst)
}

// TakeInline implements jobs.InlineTaker.
func (s *routerStore) TakeInline(t jobs.TensorInfo) ([]byte, func(), bool) {
	ti, ok := t.Handle.(storage.TensorInfo)
	if !ok {
		return nil, nil, false
	}
	return ti.TakeInline()
}

func (s *routerStore) Write(ctx context.Context, uri string, outs []jobs.OutTensor, meta map[string]string) (map[string]string, int64, error) {
	ts := make([]storage.OutTensor, len(outs))
	for i, o := range outs {
		ts[i] = storage.OutTensor{Name: o.Name, DType: o.DType, Shape: o.Shape, Data: o.Data}
	}
	wr, err := s.r.Write(ctx, uri, ts, meta)
	if err != nil {
		return nil, 0, err
	}
	return wr.SHA256, wr.Bytes, nil
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
	rs := &routerStore{r: storage.NewRouter(storage.WithMaxHeaderBytes(cfg.Limits.MaxHeaderBytes),
		storage.WithSharedReads(!cfg.Storage.DisableSharedReads))}
	if root := cfg.Storage.FileRoot; root != "" {
		fs, err := file.New(root)
		if err != nil {
			return nil, fmt.Errorf("config: storage.file_root: %w", err)
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
		return nil, errors.New("config: storage: neither storage.file_root nor storage.s3.endpoint is set")
	}
	return rs, nil
}
