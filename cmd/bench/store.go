package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
)

// s3Store is a minimal jobs.Store over minio-go, used for the in-process end
// to end run until cmd/worker and storage/s3 are in the tree. It does what a
// real store must at least do: one ranged GET for the safetensors header
// (the first headPrefix bytes), one ranged GET straight into the job's
// buffer per tensor, one PUT per output object. Replace it with
// storage.Router once that lands, so the bench measures the real code.
type s3Store struct {
	mc     *minio.Client
	bucket string
}

// headPrefix is how much of an object Head reads: a safetensors header of
// one tensor is about 100 bytes, and a small tensor (8x1024 f32 = 32 KiB)
// fits whole, so Head keeps its bytes and Fetch copies them instead of
// making a second request. The first profile showed the small-job load
// bound by request count (header GET + data GET per tensor), not bytes.
const headPrefix = 64 << 10

type stHeader struct {
	DType   string   `json:"dtype"`
	Shape   []int    `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

type s3Handle struct {
	key    string
	offset int64  // of the tensor's first data byte in the object
	data   []byte // the tensor's bytes when Head's read already held them
}

var _ jobs.Store = (*s3Store)(nil)

func (s *s3Store) key(uri string) (string, error) {
	p, ok := strings.CutPrefix(uri, "s3://"+s.bucket+"/")
	if !ok || p == "" {
		return "", fmt.Errorf("%w: %s is outside s3://%s/", storage.ErrNotAllowed, uri, s.bucket)
	}
	if i := strings.IndexByte(p, '#'); i >= 0 {
		p = p[:i]
	}
	return p, nil
}

func (s *s3Store) Check(uri string, _ bool) error {
	_, err := s.key(uri)
	return err
}

func (s *s3Store) Head(ctx context.Context, uri string) (jobs.TensorInfo, error) {
	k, err := s.key(uri)
	if err != nil {
		return jobs.TensorInfo{}, err
	}
	opts := minio.GetObjectOptions{}
	if err := opts.SetRange(0, headPrefix-1); err != nil {
		return jobs.TensorInfo{}, err
	}
	obj, err := s.mc.GetObject(ctx, s.bucket, k, opts)
	if err != nil {
		return jobs.TensorInfo{}, fmt.Errorf("head %s: %w", uri, err)
	}
	defer obj.Close()
	buf := make([]byte, headPrefix)
	n, err := io.ReadFull(obj, buf)
	if err != nil && err != io.ErrUnexpectedEOF {
		return jobs.TensorInfo{}, fmt.Errorf("head %s: %w", uri, err)
	}
	drain(obj)
	if n < 8 {
		return jobs.TensorInfo{}, fmt.Errorf("head %s: %w: %d bytes", uri, storage.ErrFormat, n)
	}
	hl := int64(binary.LittleEndian.Uint64(buf[:8]))
	if hl > int64(n-8) {
		return jobs.TensorInfo{}, fmt.Errorf("head %s: %w: header of %d bytes exceeds the bench store's %d", uri, storage.ErrFormat, hl, headPrefix)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(buf[8:8+hl], &hdr); err != nil {
		return jobs.TensorInfo{}, fmt.Errorf("head %s: %w: %w", uri, storage.ErrFormat, err)
	}
	name := ""
	if i := strings.IndexByte(uri, '#'); i >= 0 {
		name = uri[i+1:]
	}
	for tname, raw := range hdr {
		if tname == "__metadata__" || (name != "" && tname != name) {
			continue
		}
		var h stHeader
		if err := json.Unmarshal(raw, &h); err != nil {
			return jobs.TensorInfo{}, fmt.Errorf("head %s: %w: %w", uri, storage.ErrFormat, err)
		}
		hd := s3Handle{key: k, offset: 8 + hl + h.Offsets[0]}
		if end := hd.offset + h.Offsets[1] - h.Offsets[0]; end <= int64(n) && h.Offsets[1] >= h.Offsets[0] {
			hd.data = buf[hd.offset:end]
		}
		return jobs.TensorInfo{URI: uri, DType: h.DType, Shape: h.Shape, Size: h.Offsets[1] - h.Offsets[0], Handle: hd}, nil
	}
	return jobs.TensorInfo{}, fmt.Errorf("head %s: %w: no tensor", uri, storage.ErrFormat)
}

func (s *s3Store) Fetch(ctx context.Context, t jobs.TensorInfo, dst []byte) error {
	h, ok := t.Handle.(s3Handle)
	if !ok || int64(len(dst)) != t.Size {
		return fmt.Errorf("fetch %s: bad handle or size", t.URI)
	}
	if h.data != nil {
		copy(dst, h.data)
		return nil
	}
	opts := minio.GetObjectOptions{}
	if err := opts.SetRange(h.offset, h.offset+t.Size-1); err != nil {
		return err
	}
	obj, err := s.mc.GetObject(ctx, s.bucket, h.key, opts)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", t.URI, err)
	}
	defer obj.Close()
	if _, err := io.ReadFull(obj, dst); err != nil {
		return fmt.Errorf("fetch %s: %w", t.URI, err)
	}
	drain(obj)
	return nil
}

// encodeHeader returns the safetensors header (length prefix included) for
// outs in name order.
func encodeHeader(outs []jobs.OutTensor, meta map[string]string) []byte {
	sort.Slice(outs, func(i, j int) bool { return outs[i].Name < outs[j].Name })
	m := map[string]any{}
	if len(meta) > 0 {
		m["__metadata__"] = meta
	}
	var off int64
	for _, o := range outs {
		m[o.Name] = stHeader{DType: o.DType, Shape: o.Shape, Offsets: [2]int64{off, off + int64(len(o.Data))}}
		off += int64(len(o.Data))
	}
	js, _ := json.Marshal(m) // maps of strings and ints: cannot fail
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	out := make([]byte, 8, 8+len(js))
	binary.LittleEndian.PutUint64(out, uint64(len(js)))
	return append(out, js...)
}

func (s *s3Store) Write(ctx context.Context, uri string, outs []jobs.OutTensor, meta map[string]string) (map[string]string, int64, error) {
	k, err := s.key(uri)
	if err != nil {
		return nil, 0, err
	}
	outs = append([]jobs.OutTensor(nil), outs...)
	hdr := encodeHeader(outs, meta)
	readers := []io.Reader{bytes.NewReader(hdr)}
	size := int64(len(hdr))
	sums := map[string]string{}
	for _, o := range outs {
		sum := sha256.Sum256(o.Data)
		sums[o.Name] = hex.EncodeToString(sum[:])
		readers = append(readers, bytes.NewReader(o.Data))
		size += int64(len(o.Data))
	}
	if _, err := s.mc.PutObject(ctx, s.bucket, k, io.MultiReader(readers...), size,
		putOptions()); err != nil {
		return nil, 0, fmt.Errorf("write %s: %w", uri, err)
	}
	return sums, size, nil
}

func (s *s3Store) Ping(ctx context.Context) error {
	_, err := s.mc.BucketExists(ctx, s.bucket)
	return err
}

// putTensor stores one F32 tensor as a safetensors object named "t".
func putTensor(ctx context.Context, mc *minio.Client, key string, shape []int, data []float32) error {
	b := make([]byte, 4*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	hdr := encodeHeader([]jobs.OutTensor{{Name: "t", DType: "F32", Shape: shape, Data: b}}, nil)
	_, err := mc.PutObject(ctx, benchBucket, key, io.MultiReader(bytes.NewReader(hdr), bytes.NewReader(b)),
		int64(len(hdr)+len(b)), minio.PutObjectOptions{})
	if err != nil {
		return fmt.Errorf("put input %s: %w", key, err)
	}
	return nil
}

// drain reads a response to its end. net/http reuses a connection only
// after its body hit EOF; a ranged read that stops at exactly the range's
// length leaves the body open and Close then drops the connection, so the
// next request dials again (seen in the profile as dialConn and
// persistConn.close).
func drain(r io.Reader) { _, _ = io.Copy(io.Discard, r) }
