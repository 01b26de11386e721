package s3

import (
	"context"
	"strings"
	"testing"
)

// TestPartPlan: objects up to the multipart threshold (128 MiB by default)
// are one PUT; above it the split keeps size/PartSize parts (rounded
// down), makes the first part, which holds the header that waits for the
// tensors' sha256s, the S3 minimum of 5 MiB, and keeps every part but the
// last at least 5 MiB and every middle part at least PartSize; an object
// under two part sizes is 2 parts.
func TestPartPlan(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name      string
		part, thr uint64
		size      int64
		wantParts int
		wantFirst int64
	}{
		{"64 MiB output, defaults: one PUT", 0, 0, 64*mib + 264, 0, 0},
		{"128 MiB object, defaults: one PUT", 0, 0, 128 * mib, 0, 0},
		{"just over the default threshold", 0, 0, 128*mib + 1, 8, 5 * mib},
		{"64 MiB output, threshold 16 MiB", 0, 16 * mib, 64*mib + 264, 4, 5 * mib},
		{"256 MiB output", 16 * mib, 0, 256*mib + 4096 + 300, 16, 5 * mib},
		{"just over 2 parts", 16 * mib, 16 * mib, 32*mib + 1, 2, 5 * mib},
		{"just under 3 parts", 16 * mib, 16 * mib, 48*mib - 1, 2, 5 * mib},
		{"part size at the S3 minimum: equal parts", 5 * mib, 5 * mib, 11*mib + 700*1024, 2, (11*mib + 700*1024 + 1) / 2},
		{"between one and two part sizes", 16 * mib, 16 * mib, 20 * mib, 2, 5 * mib},
		{"part size 5 MiB, 6 MiB object", 5 * mib, 5 * mib, 6 * mib, 2, 5 * mib},
		{"threshold below the part size", 16 * mib, 8 * mib, 12 * mib, 2, 5 * mib},
		{"at the threshold", 16 * mib, 16 * mib, 16 * mib, 0, 0},
		{"5 MiB: one PUT whatever the threshold", 5 * mib, 1, 5 * mib, 0, 0},
		{"small", 0, 0, 1 * mib, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Store{part: c.part, threshold: c.thr}
			b := s.partPlan(c.size)
			if c.wantParts == 0 {
				if b != nil {
					t.Fatalf("partPlan(%d) = %v, want one PUT (nil)", c.size, b)
				}
				return
			}
			if len(b) != c.wantParts+1 || b[0] != 0 || b[len(b)-1] != c.size {
				t.Fatalf("partPlan(%d) = %v: want %d parts covering [0, %d)", c.size, b, c.wantParts, c.size)
			}
			if b[1] != c.wantFirst {
				t.Errorf("first part is %d bytes, want %d", b[1], c.wantFirst)
			}
			base := int64(c.part)
			if base == 0 {
				base = 16 * mib
			}
			for i := 1; i < len(b); i++ {
				n := b[i] - b[i-1]
				switch {
				case n <= 0:
					t.Errorf("part %d is %d bytes", i, n)
				case i < len(b)-1 && n < minPart:
					t.Errorf("part %d of %d is %d bytes: below the S3 minimum for a part that is not the last", i, len(b)-1, n)
				case i > 1 && i < len(b)-1 && n < base:
					t.Errorf("part %d is %d bytes, below the part size %d", i, n, base)
				}
			}
		})
	}
}

// TestNewRejects: configurations S3 cannot serve fail at New, naming the
// setting and the limit, before any request.
func TestNewRejects(t *testing.T) {
	ok := Config{Endpoint: "127.0.0.1:1", AccessKey: "k", SecretKey: "s", Allow: []AllowRule{{Bucket: "data"}}}
	for _, c := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"part size under 5 MiB", func(c *Config) { c.PartSize = 1 << 20 }, "part size 1048576 bytes: S3 takes parts of 5 MiB"},
		{"part size over 5 GiB", func(c *Config) { c.PartSize = 6 << 30 }, "part size 6442450944 bytes"},
		{"threshold over 5 GiB", func(c *Config) { c.MultipartThreshold = 6 << 30 }, "multipart threshold 6442450944 bytes: over S3's largest single PUT"},
		{"no endpoint", func(c *Config) { c.Endpoint = "" }, "endpoint is required"},
		{"scheme", func(c *Config) { c.Endpoint = "http://x:1" }, "without a scheme"},
		{"empty allow-list", func(c *Config) { c.Allow = nil }, "allow-list is empty"},
		{"half the keys", func(c *Config) { c.SecretKey = "" }, "go together"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.edit(&cfg)
			_, err := New(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("New = %v, want an error containing %q", err, c.want)
			}
		})
	}
}
