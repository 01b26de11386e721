package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/rmsgrad/rmsgrad/compute"
	"github.com/rmsgrad/rmsgrad/internal/jobstore"
	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// routerStore is the worker's adapter (internal/jobstore, which
// cmd/worker uses too) with a Ping of the bench bucket: the in-process
// profile run uses the same router, S3 store and adapter as bin/worker, so
// its profile is the product's.
type routerStore struct {
	jobstore.Store
	r *storage.Router
}

var _ jobs.Store = routerStore{}

func newRouterStoreOf(r *storage.Router) routerStore {
	return routerStore{Store: jobstore.Store{R: r}, r: r}
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
	return newRouterStoreOf(r), nil
}

// putTensor stores one F32 tensor as a safetensors object named "t" through
// the router, as cmd/enqueue uploads inputs.
func putTensor(ctx context.Context, rs routerStore, uri string, shape []int, data []float32) error {
	return putTensorAs(ctx, rs, uri, compute.F32, shape, data)
}

// putTensorAs is putTensor for a tensor of dtype dt (data rounded to it).
func putTensorAs(ctx context.Context, rs routerStore, uri string, dt compute.DType, shape []int, data []float32) error {
	t := safetensors.Tensor{Name: "t", DType: string(dt), Shape: shape, Data: make([]byte, dt.Size()*len(data))}
	dt.Encode(t.Data, data)
	if _, err := rs.r.Write(ctx, uri, []storage.OutTensor{t}, nil); err != nil {
		return fmt.Errorf("put input %s: %w", uri, err)
	}
	return nil
}
