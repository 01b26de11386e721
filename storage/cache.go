package storage

import (
	"sync"

	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// headerCache keeps the parsed headers of recently read objects. An entry
// is used only while the object's size and ETag are unchanged, so a
// replaced object is always re-read; objects without an ETag are not cached.
type headerCache struct {
	mu    sync.Mutex
	max   int
	order []string // oldest first
	m     map[string]cached
}

type cached struct {
	info ObjectInfo
	h    *safetensors.Header
}

func newHeaderCache(n int) *headerCache {
	return &headerCache{max: n, m: make(map[string]cached, n)}
}

func (c *headerCache) get(key string, info ObjectInfo) *safetensors.Header {
	if c == nil || info.ETag == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || e.info != info {
		return nil
	}
	return e.h
}

// size returns the size the object had when its header was cached: Head
// uses it to pick between one GET of a small object and HEAD + cached
// header for a large one.
func (c *headerCache) size(key string) (int64, bool) {
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	return e.info.Size, ok
}

func (c *headerCache) put(key string, info ObjectInfo, h *safetensors.Header) {
	if c == nil || info.ETag == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; !ok {
		if len(c.order) >= c.max {
			delete(c.m, c.order[0])
			c.order = c.order[1:]
		}
		c.order = append(c.order, key)
	}
	c.m[key] = cached{info: info, h: h}
}

func (c *headerCache) drop(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; !ok {
		return
	}
	delete(c.m, key)
	for i, k := range c.order {
		if k == key {
			c.order = append(c.order[:i], c.order[i+1:]...)
			break
		}
	}
}
