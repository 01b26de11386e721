package jobs

import (
	"container/list"
	"errors"
	"slices"
	"sync"
)

// ErrPinMismatch is wrapped when w's tensor data does not hash to the
// job's w_sha256: w was replaced after the job was posted, or the pin is
// wrong. It is permanent: a retry reads the same object.
var ErrPinMismatch = errors.New("w does not match the job's w_sha256")

// DefaultPinCacheBytes is the default bound of a worker's PinCache.
const DefaultPinCacheBytes = 64 << 20

// PinCache keeps the w tensors that jobs pinned (Job.WSHA256) after one
// job read them and found that they hash to the pin. A later job that names
// the same w URI with the same pin takes w from here: no request, no hash.
// What is served is always bytes that hashed to the job's own pin; the
// dtype and shape are those of the header read with them (a w rewritten
// with byte-identical data under another 2-byte dtype, F16 for BF16, would
// keep the old one: repin after such a rewrite).
//
// The cache is bounded by bytes (least recently used out first); a tensor
// over a sixteenth of the bound is checked but not kept. A model's norm
// weights are a few MiB in all (80 layers x 2 x 8192 x 4 bytes = 5 MiB),
// so the default bound keeps every w of a fleet's models. Safe for
// concurrent use; the zero value is not usable, a nil *PinCache keeps
// nothing.
type PinCache struct {
	mu   sync.Mutex
	max  int64
	used int64
	ll   *list.List // front: most recently used; values *pinned
	m    map[pinKey]*list.Element
	// onSize reports the bytes held after each change (the metrics gauge).
	onSize func(int64)
}

type pinKey struct{ uri, sum string }

// pinned is one kept w. Its fields are read-only once it is in the cache.
type pinned struct {
	key   pinKey
	dtype string
	shape []int
	data  []byte
}

// NewPinCache returns a cache of at most maxBytes of tensor data; nil when
// maxBytes <= 0 (pins are then checked on every read, nothing is kept).
func NewPinCache(maxBytes int64) *PinCache {
	if maxBytes <= 0 {
		return nil
	}
	return &PinCache{max: maxBytes, ll: list.New(), m: map[pinKey]*list.Element{}}
}

// get returns the w kept for uri under sum.
func (c *PinCache) get(uri, sum string) (*pinned, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[pinKey{uri, sum}]
	if !ok {
		return nil, false
	}
	c.ll.MoveToFront(e)
	return e.Value.(*pinned), true
}

// put keeps a copy of data (which hashed to sum) for uri, evicting the
// least recently used entries to stay under the bound.
func (c *PinCache) put(uri, sum, dtype string, shape []int, data []byte) {
	if c == nil || int64(len(data)) > c.max/16 {
		return
	}
	k := pinKey{uri, sum}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[k]; ok {
		c.ll.MoveToFront(e)
		return
	}
	p := &pinned{key: k, dtype: dtype, shape: slices.Clone(shape), data: slices.Clone(data)}
	c.m[k] = c.ll.PushFront(p)
	c.used += int64(len(data))
	for c.used > c.max {
		old := c.ll.Back()
		op := old.Value.(*pinned)
		c.ll.Remove(old)
		delete(c.m, op.key)
		c.used -= int64(len(op.data))
	}
	if c.onSize != nil {
		c.onSize(c.used)
	}
}

// Bytes is the tensor data held now.
func (c *PinCache) Bytes() int64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

// Len is the number of tensors held now.
func (c *PinCache) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
