// Package jobstore adapts storage.Router to the jobs.Store the handler
// needs. The worker (cmd/worker) and the bench's in-process and
// no-network runs (cmd/bench) use this one adapter, so the bench profiles
// exactly the product's path.
package jobstore

import (
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
)

// Store is a storage.Router as a jobs.Store and jobs.InlineTaker (less
// Ping, which each command defines for its own stores).
type Store struct {
	R *storage.Router
}

// Check implements jobs.Store.
func (s Store) Check(uri string, write bool) error { return s.R.Check(uri, write) }

// Head implements jobs.Store: Handle carries the storage.TensorInfo.
func (s Store) Head(ctx context.Context, uri string) (jobs.TensorInfo, error) {
	t, err := s.R.Head(ctx, uri)
	if err != nil {
		return jobs.TensorInfo{}, err
	}
	return jobs.TensorInfo{URI: uri, DType: t.DType, Shape: t.Shape, Size: t.Size, Local: t.Inline(), Handle: t}, nil
}

// Fetch implements jobs.Store.
func (s Store) Fetch(ctx context.Context, t jobs.TensorInfo, dst []byte) error {
	ti, ok := t.Handle.(storage.TensorInfo)
	if !ok {
		return fmt.Errorf("fetch %s: tensor info did not come from this store", t.URI)
	}
	return s.R.Fetch(ctx, ti, dst)
}

// TakeInline implements jobs.InlineTaker.
func (s Store) TakeInline(t jobs.TensorInfo) ([]byte, func(), bool) {
	ti, ok := t.Handle.(storage.TensorInfo)
	if !ok {
		return nil, nil, false
	}
	return ti.TakeInline()
}

// Write implements jobs.Store. When every output carries its digest (the
// batcher hashed it), the router records those instead of hashing again.
func (s Store) Write(ctx context.Context, uri string, outs []jobs.OutTensor, meta map[string]string) (map[string]string, int64, error) {
	ts := make([]storage.OutTensor, len(outs))
	summed := len(outs) > 0
	for i, o := range outs {
		ts[i] = storage.OutTensor{Name: o.Name, DType: o.DType, Shape: o.Shape, Data: o.Data}
		summed = summed && o.SHA256 != nil
	}
	var opts []storage.WriteOption
	if summed {
		sums := make([][sha256.Size]byte, len(outs))
		for i, o := range outs {
			sums[i] = *o.SHA256
		}
		opts = append(opts, storage.WithSHA256(sums))
	}
	wr, err := s.R.Write(ctx, uri, ts, meta, opts...)
	if err != nil {
		return nil, 0, err
	}
	return wr.SHA256, wr.Bytes, nil
}
