package s3

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"sync"
)

// Uploads carry a CRC32C of their body in the x-amz-checksum-crc32c header
// (a single PUT) or of each part (multipart), so the server refuses a body
// cut short instead of storing it. The sums are computed before the
// request, in a pass over memory at about 10 GB/s, and sent as headers:
// the body then goes up plain, which versitygw takes faster than the
// aws-chunked encoding a trailer needs.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcHeadSplit is where crc32cAt splits a body: bytes from here on are
// summed first. A Write body's first bytes (the safetensors header, a few
// hundred bytes) wait for the tensors' sha256s; the rest can be summed
// while Write hashes, so only the header's CRC is left when it is ready.
const crcHeadSplit = 4 << 10

// crcOnePassMax is the largest body summed in one pass, head included:
// storage.Router.Write hashes an object this small (its inlineHashMax)
// and finishes the header before it calls Put, so there is no hashing to
// overlap, and one hardware pass (about 2 us for 36 KiB) is cheaper than
// two passes and a combine.
const crcOnePassMax = 1 << 20

// crc32cAt returns the CRC32C of n bytes of ra at off: up to crcOnePassMax
// in one pass, else the bytes past crcHeadSplit first, then the head,
// combined.
func crc32cAt(ra io.ReaderAt, off, n int64) (uint32, error) {
	if n <= crcOnePassMax {
		return crc32cRange(ra, off, n)
	}
	split := min(n, crcHeadSplit)
	tail, err := crc32cRange(ra, off+split, n-split)
	if err != nil {
		return 0, err
	}
	head, err := crc32cRange(ra, off, split)
	if err != nil {
		return 0, err
	}
	return crc32cCombine(head, tail, n-split), nil
}

func crc32cRange(ra io.ReaderAt, off, n int64) (uint32, error) {
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	var sum uint32
	for n > 0 {
		b := (*buf)[:min(n, int64(len(*buf)))]
		k, err := ra.ReadAt(b, off)
		sum = crc32.Update(sum, castagnoli, b[:k])
		off, n = off+int64(k), n-int64(k)
		if err != nil && !(err == io.EOF && n == 0) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
	return sum, nil
}

// crc32cHeader is the base64 of the big-endian sum, the form of S3's
// x-amz-checksum-crc32c.
func crc32cHeader(sum uint32) string {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], sum)
	return base64.StdEncoding.EncodeToString(b[:])
}

// copyBufs holds the checksums' read buffers: a fresh 64 KiB per PUT
// would be twice a small output.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// crc32cCombine returns the CRC32C of A||B from crcA, crcB and len(B):
// zlib's crc32_combine for the reflected Castagnoli polynomial. Appending
// len(B) zero bytes to A's register is a linear map over GF(2); the maps
// for 2^k zero bytes are computed once (zeroOps), so a combine is at most
// one matrix-vector product per bit of len(B), a few hundred ns.
func crc32cCombine(crcA, crcB uint32, lenB int64) uint32 {
	ops := zeroOps()
	for k := 0; lenB > 0; k, lenB = k+1, lenB>>1 {
		if lenB&1 != 0 {
			crcA = gf2Times(&ops[k], crcA)
		}
	}
	return crcA ^ crcB
}

// zeroOps returns the GF(2) operators that append 2^k zero bytes to a
// CRC32C register, k = 0..62: the one-zero-bit operator squared three
// times for one byte, then squared again for each k.
var zeroOps = sync.OnceValue(func() *[63][32]uint32 {
	var bit, two, four [32]uint32
	bit[0] = 0x82f63b78 // one zero bit
	row := uint32(1)
	for n := 1; n < 32; n++ {
		bit[n] = row
		row <<= 1
	}
	gf2Square(&two, &bit)
	gf2Square(&four, &two)
	ops := new([63][32]uint32)
	gf2Square(&ops[0], &four)
	for k := 1; k < len(ops); k++ {
		gf2Square(&ops[k], &ops[k-1])
	}
	return ops
})

func gf2Times(mat *[32]uint32, vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= mat[i]
		}
	}
	return sum
}

func gf2Square(square, mat *[32]uint32) {
	for n := range 32 {
		square[n] = gf2Times(mat, mat[n])
	}
}

// seekWriterTo is a body that can hand its bytes to a writer without a
// copy (storage.Segments writes the compute buffers themselves).
type seekWriterTo interface {
	io.Seeker
	io.WriterTo
}

// crc32cTo is crc32cAt for a body that is a seekWriterTo positioned at
// off: the bytes past the head (all of them up to crcOnePassMax) are
// summed straight from the body's own buffers (no copy into a read
// buffer), then the position is restored.
func crc32cTo(r seekWriterTo, ra io.ReaderAt, off, n int64) (uint32, error) {
	split := min(n, crcHeadSplit)
	if n <= crcOnePassMax {
		split = 0
	}
	w := &rangeCRC{bounds: []int64{off + split, off + n}, at: off + split, sums: make([]uint32, 1)}
	if err := w.run(r, off); err != nil {
		return 0, err
	}
	if split == 0 {
		return w.sums[0], nil
	}
	head, err := crc32cRange(ra, off, split)
	if err != nil {
		return 0, err
	}
	return crc32cCombine(head, w.sums[0], n-split), nil
}

// rangeCRC sums a body written through it from bounds[0] on into one
// CRC32C per range [bounds[i], bounds[i+1]), closing ready[i] (when set)
// as each one is complete.
type rangeCRC struct {
	bounds []int64
	at     int64 // absolute position of the next byte
	i      int   // range being summed
	sums   []uint32
	ready  []chan struct{}
}

func (w *rangeCRC) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 && w.i < len(w.sums) {
		k := min(int64(len(p)), w.bounds[w.i+1]-w.at)
		w.sums[w.i] = crc32.Update(w.sums[w.i], castagnoli, p[:k])
		p, w.at = p[k:], w.at+k
		w.advance()
	}
	if w.i == len(w.sums) {
		return n, errSummed // stop the body's WriteTo at the last range's end
	}
	return n, nil
}

// advance marks the ranges that end at w.at complete.
func (w *rangeCRC) advance() {
	for w.i < len(w.sums) && w.at == w.bounds[w.i+1] {
		if w.ready != nil {
			close(w.ready[w.i])
		}
		w.i++
	}
}

var errSummed = errors.New("summed")

// run writes r from w's first bound to its last through w and puts r back
// at home. An error leaves the ranges not yet complete unready.
func (w *rangeCRC) run(r seekWriterTo, home int64) error {
	defer r.Seek(home, io.SeekStart)
	if w.advance(); w.i == len(w.sums) {
		return nil
	}
	if _, err := r.Seek(w.bounds[0], io.SeekStart); err != nil {
		return err
	}
	if _, err := r.WriteTo(w); err != nil && err != errSummed {
		return err
	}
	if w.i < len(w.sums) {
		return io.ErrUnexpectedEOF
	}
	return nil
}
