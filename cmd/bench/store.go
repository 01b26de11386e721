package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// routerStore adapts *storage.Router to jobs.Store exactly as the worker
// does (cmd/worker/store.go, which lives in package main and so cannot be
// imported): the in-process profile run uses the same router, S3 store and
// adapter as bin/worker, so its profile is the product's.
type routerStore struct{ r *storage.Router }

var _ jobs.Store = routerStore{}

func (s routerStore) Check(uri string, write bool) error { return s.r.Check(uri, write) }

func (s routerStore) Head(ctx context.Context, uri string) (jobs.TensorInfo, error) {
	t, err := s.r.Head(ctx, uri)
	if err != nil {
		return jobs.TensorInfo{}, err
	}
	return jobs.TensorInfo{URI: uri, DType: t.DType, Shape: t.Shape, Size: t.Size, Local: t.Inline(), Handle: t}, nil
}

func (s routerStore) Fetch(ctx context.Context, t jobs.TensorInfo, dst []byte) error {
	ti, ok := t.Handle.(storage.TensorInfo)
	if !ok {
		return fmt.Errorf("fetch %s: tensor info did not come from this store", t.URI)
	}
	return s.r.Fetch(ctx, ti, dst)
}

// TakeInline implements jobs.InlineTaker.
func (s routerStore) TakeInline(t jobs.TensorInfo) ([]byte, func(), bool) {
	ti, ok := t.Handle.(storage.TensorInfo)
	if !ok {
		return nil, nil, false
	}
	return ti.TakeInline()
}

func (s routerStore) Write(ctx context.Context, uri string, outs []jobs.OutTensor, meta map[string]string) (map[string]string, int64, error) {
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

func (s routerStore) Ping(ctx context.Context) error {
	_, err := s.r.Head(ctx, "s3://"+benchBucket+"/.rmsgrad-ping")
	if errors.Is(err, storage.ErrNotFound) {
		return nil
	}
	return err
}

// newRouterStore builds what cmd/worker's openStore builds for a
// storage.s3 section with one allowed bucket and every other key at its
// default: s3.New (its transport, idle pool and retry policy) behind
// storage.NewRouter (its default header cache).
func newRouterStore(ctx context.Context, e *env) (routerStore, error) {
	st, err := s3.New(ctx, s3.Config{Endpoint: e.s3.addr, Region: "us-east-1", AccessKey: e.accessKey, SecretKey: e.secretKey,
		Allow: []s3.AllowRule{{Bucket: benchBucket}}})
	if err != nil {
		return routerStore{}, fmt.Errorf("bench: s3 store: %w", err)
	}
	r := storage.NewRouter()
	r.Register("s3", st)
	return routerStore{r: r}, nil
}

// putTensor stores one F32 tensor as a safetensors object named "t" through
// the router, as cmd/enqueue uploads inputs.
func putTensor(ctx context.Context, rs routerStore, uri string, shape []int, data []float32) error {
	t := safetensors.F32("t", shape, data)
	if _, err := rs.r.Write(ctx, uri, []storage.OutTensor{t}, nil); err != nil {
		return fmt.Errorf("put input %s: %w", uri, err)
	}
	return nil
}
