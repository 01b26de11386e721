package s3

import (
	"bytes"
	"hash/crc32"
	"io"
	"testing"

	"github.com/rmsgrad/rmsgrad/storage"
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

// TestRangeCRC: sums taken from a body's WriteTo, per range and for a
// PUT body past its head, match the sums of the bytes, whatever the
// segment boundaries; the body's position is restored.
func TestRangeCRC(t *testing.T) {
	data := make([]byte, 200000)
	for i := range data {
		data[i] = byte(i*17 + i>>5)
	}
	body := storage.NewSegments(data[:100], data[100:70000], data[70000:70001], data[70001:])
	want := func(a, b int64) uint32 { return crc32.Checksum(data[a:b], castagnoli) }
	for _, c := range [][2]int64{{0, 0}, {0, 100}, {3, 4096}, {3, 4097}, {50, 200000}, {100, 100000}} {
		if _, err := body.Seek(c[0], io.SeekStart); err != nil {
			t.Fatal(err)
		}
		got, err := crc32cTo(body, body, c[0], c[1]-c[0])
		if err != nil || got != want(c[0], c[1]) {
			t.Errorf("crc32cTo [%d, %d) = %08x, %v; want %08x", c[0], c[1], got, err, want(c[0], c[1]))
		}
		if pos, _ := body.Seek(0, io.SeekCurrent); pos != c[0] {
			t.Errorf("crc32cTo [%d, %d) left the body at %d", c[0], c[1], pos)
		}
	}
	bounds := []int64{5, 69999, 70001, 70001, 150000}
	w := &rangeCRC{bounds: bounds, at: bounds[0], sums: make([]uint32, len(bounds)-1), ready: make([]chan struct{}, len(bounds)-1)}
	for i := range w.ready {
		w.ready[i] = make(chan struct{})
	}
	if err := w.run(body, 7); err != nil {
		t.Fatal(err)
	}
	for i := range w.sums {
		<-w.ready[i]
		if w.sums[i] != want(bounds[i], bounds[i+1]) {
			t.Errorf("range %d [%d, %d): %08x, want %08x", i, bounds[i], bounds[i+1], w.sums[i], want(bounds[i], bounds[i+1]))
		}
	}
	short := &rangeCRC{bounds: []int64{10, 300000}, at: 10, sums: make([]uint32, 1)}
	if err := short.run(body, 0); err == nil {
		t.Error("a range past the body's end: no error")
	}
}

// TestCRC32COnePassMatchesCombined: the one-pass sum of a body up to
// crcOnePassMax and the head/tail combine used above it agree with each
// other and with the sum of the bytes, for several head/tail splits and
// sizes on both sides of crcOnePassMax, through crc32cAt and crc32cTo.
func TestCRC32COnePassMatchesCombined(t *testing.T) {
	data := make([]byte, crcOnePassMax+3*crcHeadSplit)
	for i := range data {
		data[i] = byte(i*29 + i>>9)
	}
	body := storage.NewSegments(data[:300], data[300:crcOnePassMax-7], data[crcOnePassMax-7:])
	for _, n := range []int64{36 << 10, crcOnePassMax - 1, crcOnePassMax, crcOnePassMax + 1, crcOnePassMax + crcHeadSplit + 5} {
		want := crc32.Checksum(data[:n], castagnoli)
		for _, split := range []int64{0, 1, 300, crcHeadSplit, n / 2, n - 1, n} {
			head := crc32.Checksum(data[:split], castagnoli)
			tail := crc32.Checksum(data[split:n], castagnoli)
			if got := crc32cCombine(head, tail, n-split); got != want {
				t.Errorf("n %d split %d: combined %08x, one pass %08x", n, split, got, want)
			}
		}
		if got, err := crc32cAt(bytes.NewReader(data), 0, n); err != nil || got != want {
			t.Errorf("crc32cAt(0, %d) = %08x, %v; want %08x", n, got, err, want)
		}
		if _, err := body.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		if got, err := crc32cTo(body, body, 0, n); err != nil || got != want {
			t.Errorf("crc32cTo(0, %d) = %08x, %v; want %08x", n, got, err, want)
		}
	}
}
