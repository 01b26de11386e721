package s3

import (
	"testing"

	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/storetest"
)

// BenchmarkCRC32CBody is the CRC32C of a Write body as Put sums it: a
// few hundred bytes of header, then the tensor's buffer.
func BenchmarkCRC32CBody(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
	}{{"32KiB", 32 << 10}, {"4MiB", 4 << 20}} {
		hdr := storetest.Pattern(7, 400)
		body := storage.NewSegments(hdr, storetest.Pattern(8, c.n))
		size := int64(len(hdr) + c.n)
		b.Run("size="+c.name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if _, err := crc32cTo(body, body, 0, size); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
