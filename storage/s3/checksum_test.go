package s3

import (
	"bytes"
	"hash/crc32"
	"testing"
)

// TestCRC32CCombine: the sum of a body split anywhere, combined, is the
// sum of the whole body.
func TestCRC32CCombine(t *testing.T) {
	data := make([]byte, 3*crcHeadSplit+12345)
	for i := range data {
		data[i] = byte(i*131 + i>>7)
	}
	want := crc32.Checksum(data, castagnoli)
	for _, cut := range []int{0, 1, 7, 4096, crcHeadSplit, len(data) - 1, len(data)} {
		a, b := crc32.Checksum(data[:cut], castagnoli), crc32.Checksum(data[cut:], castagnoli)
		if got := crc32cCombine(a, b, int64(len(data)-cut)); got != want {
			t.Errorf("cut at %d: combined %08x, want %08x", cut, got, want)
		}
	}
	for _, n := range []int{0, 1, crcHeadSplit - 1, crcHeadSplit, crcHeadSplit + 1, len(data) - 5} {
		got, err := crc32cAt(bytes.NewReader(data), 5, int64(n))
		if err != nil || got != crc32.Checksum(data[5:5+n], castagnoli) {
			t.Errorf("crc32cAt(5, %d) = %08x, %v; want %08x", n, got, err, crc32.Checksum(data[5:5+n], castagnoli))
		}
	}
	if _, err := crc32cAt(bytes.NewReader(data), 0, int64(len(data)+1)); err == nil {
		t.Error("crc32cAt past the end: no error")
	}
}
