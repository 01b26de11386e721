package cpu

import (
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

// TestPoolLimit: with PoolLimit, buffers in use and pooled together stay
// within the limit however many shapes come and go; without it, the pool
// keeps a buffer of every size class it has seen.
func TestPoolLimit(t *testing.T) {
	const limit = 4 << 20
	for _, tc := range []struct {
		name    string
		opts    []Option
		bounded bool
	}{{"limited", []Option{PoolLimit(limit)}, true}, {"default", nil, false}} {
		b := New(tc.opts...)
		// Twelve shapes of ~1 MiB in distinct size classes, three in use
		// at a time.
		for round := 0; round < 3; round++ {
			for i := 0; i < 12; i++ {
				var bufs []compute.Buffer
				for k := 0; k < 3; k++ {
					buf, err := b.Alloc(compute.F32, 64+8*i, 4096)
					if err != nil {
						t.Fatal(err)
					}
					bufs = append(bufs, buf)
				}
				for _, buf := range bufs {
					buf.Release()
				}
				b.pool.mu.Lock()
				held := 4 * (b.pool.retained + b.pool.out)
				b.pool.mu.Unlock()
				if tc.bounded && held > limit {
					t.Fatalf("%s: round %d shape %d: %d bytes in use + pooled, limit %d", tc.name, round, i, held, limit)
				}
			}
		}
		b.pool.mu.Lock()
		retained := 4 * b.pool.retained
		b.pool.mu.Unlock()
		if !tc.bounded && retained <= limit {
			t.Fatalf("default pool kept only %d bytes: the test no longer shows what PoolLimit bounds", retained)
		}
		if b.pool.out != 0 {
			t.Fatalf("%s: %d words still counted as handed out after every buffer was released", tc.name, b.pool.out)
		}
	}
}
