package s3

import "testing"

// TestPartPlan: the multipart split keeps size/PartSize parts (rounded
// down), makes the first part, which holds the header that waits for the
// tensors' sha256s, the S3 minimum of 5 MiB, and keeps every part but the
// last at least 5 MiB and every middle part at least PartSize; an object
// between one and two part sizes is 2 parts, one up to PartSize one PUT.
func TestPartPlan(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name      string
		part      uint64
		size      int64
		wantParts int
		wantFirst int64
	}{
		{"64 MiB output, default part size", 0, 64*mib + 264, 4, 5 * mib},
		{"256 MiB output", 16 * mib, 256*mib + 4096 + 300, 16, 5 * mib},
		{"just over 2 parts", 16 * mib, 32*mib + 1, 2, 5 * mib},
		{"just under 3 parts", 16 * mib, 48*mib - 1, 2, 5 * mib},
		{"part size at the S3 minimum: equal parts", 5 * mib, 11*mib + 700*1024, 2, (11*mib + 700*1024 + 1) / 2},
		{"between one and two part sizes", 16 * mib, 20 * mib, 2, 5 * mib},
		{"part size 5 MiB, 6 MiB object", 5 * mib, 6 * mib, 2, 5 * mib},
		{"one part", 16 * mib, 16 * mib, 0, 0},
		{"small", 0, 1 * mib, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Store{part: c.part}
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
