package s3_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
	"github.com/rmsgrad/rmsgrad/storage/storetest"
)

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func tensor(name string, rows, cols int, seed uint64) storage.OutTensor {
	return storage.OutTensor{Name: name, DType: "F32", Shape: []int{rows, cols}, Data: storetest.Pattern(seed, rows*cols*4)}
}

// TestRangeReadOneTensor: Head reads only the header (one small GET, then
// nothing but a HEAD once cached) and Fetch reads exactly the tensor's byte
// range of a multi-tensor object, straight into the buffer.
func TestRangeReadOneTensor(t *testing.T) { eachServer(t, testRangeReadOneTensor) }

func testRangeReadOneTensor(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	tp := newTap()
	r := newRouter(newStore(t, gw, func(c *s3.Config) { c.Transport = tp }))
	uri := "s3://data/t/multi.safetensors"
	ts := []storage.OutTensor{tensor("x", 512, 512, 1), tensor("w", 1, 512, 2), tensor("dy", 512, 1024, 3)}
	res, err := r.Write(ctx, uri, ts, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range ts {
		tp.reset()
		ti, err := r.Head(ctx, uri+"#"+want.Name)
		if err != nil {
			t.Fatal(err)
		}
		// The first Head: one GET of the object's first 64 KiB gives size,
		// version and header. Later Heads of this (large) object: one HEAD
		// validates the cached header.
		if got := tp.matching(""); i == 0 && (len(got) != 1 || !strings.HasSuffix(got[0], "GET /data/t/multi.safetensors bytes=0-65535")) {
			t.Fatalf("first Head made requests %v, want one GET of bytes=0-65535", got)
		} else if i > 0 && (len(got) != 1 || got[0] != "HEAD /data/t/multi.safetensors") {
			t.Fatalf("Head %d made requests %v, want one HEAD", i, got)
		}
		tp.reset()
		dst := make([]byte, ti.Size)
		if err := r.Fetch(ctx, ti, dst); err != nil {
			t.Fatal(err)
		}
		wantRange := fmt.Sprintf("bytes=%d-%d", ti.Offset, ti.Offset+ti.Size-1)
		if got := tp.matching(""); len(got) != 1 || !strings.HasSuffix(got[0], "GET /data/t/multi.safetensors "+wantRange) {
			t.Errorf("Fetch %s made requests %v, want one GET with Range %s", want.Name, got, wantRange)
		}
		if tp.readBytes.Load() != ti.Size {
			t.Errorf("Fetch %s transferred %d body bytes for a %d-byte tensor of a %d-byte object", want.Name, tp.readBytes.Load(), ti.Size, res.Bytes)
		}
		if !bytes.Equal(dst, want.Data) {
			t.Errorf("Fetch %s returned other bytes", want.Name)
		}
	}
}

// TestTailRead: a tensor at the end of its object behind a small header
// (the common single-tensor file) is read with one plain GET whose prefix is
// dropped, not a Range GET: the server's whole-object path is faster. A
// tensor behind more than 64 KiB still gets its exact range.
func TestTailRead(t *testing.T) { eachServer(t, testTailRead) }

func testTailRead(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	tp := newTap()
	r := newRouter(newStore(t, gw, func(c *s3.Config) { c.Transport = tp }))
	uri := "s3://data/t/tail.safetensors"
	x := tensor("x", 256, 1024, 31)
	res, err := r.Write(ctx, uri, []storage.OutTensor{tensor("w", 1, 1024, 30), x}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ti, err := r.Head(ctx, uri+"#x")
	if err != nil {
		t.Fatal(err)
	}
	if ti.ObjectSize != res.Bytes || ti.Offset+ti.Size != ti.ObjectSize {
		t.Fatalf("Head = %+v, want x at the tail of a %d-byte object", ti, res.Bytes)
	}
	tp.reset()
	dst := make([]byte, ti.Size)
	if err := r.Fetch(ctx, ti, dst); err != nil {
		t.Fatal(err)
	}
	if got := tp.matching(""); len(got) != 1 || got[0] != "GET /data/t/tail.safetensors" || tp.readBytes.Load() != res.Bytes {
		t.Errorf("tail Fetch made requests %v reading %d bytes, want one plain GET of the %d-byte object", got, tp.readBytes.Load(), res.Bytes)
	}
	if !bytes.Equal(dst, x.Data) {
		t.Error("tail Fetch returned other bytes")
	}
	// Pinned like a range read: a replaced object is ErrChanged.
	if _, err := r.Write(ctx, uri, []storage.OutTensor{tensor("w", 1, 1024, 32), x}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Fetch(ctx, ti, dst); !errors.Is(err, storage.ErrChanged) {
		t.Errorf("tail Fetch of a replaced object = %v, want ErrChanged", err)
	}
}

var multipartETag = regexp.MustCompile(`-(\d+)"?$`)

// TestMultipart: an output larger than the part size goes up as a
// multipart upload (the object's ETag says how many parts) and reads back
// byte for byte.
func TestMultipart(t *testing.T) { eachServer(t, testMultipart) }

func testMultipart(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	tp := newTap()
	st := newStore(t, gw, func(c *s3.Config) { c.Transport = tp; c.PartSize, c.MultipartThreshold = 5<<20, 5<<20 })
	r := newRouter(st)
	uri := "s3://data/t/mp.safetensors"
	ts := []storage.OutTensor{tensor("dx", 3000, 1024, 5), tensor("dw", 1, 1024, 6)} // ~11.7 MiB: 2 parts of ~5.9 MiB
	res, err := r.Write(ctx, uri, ts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := tp.matching("POST ", "uploads"); len(got) != 1 {
		t.Errorf("want one CreateMultipartUpload, got %v", got)
	}
	if got := tp.matching("PUT ", "partNumber="); len(got) != 2 {
		t.Errorf("want 2 UploadPart requests, got %v", got)
	}
	ref, _ := storage.ParseRef(uri)
	info, err := st.Stat(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if m := multipartETag.FindStringSubmatch(info.ETag); m == nil || m[1] != "2" || info.Size != res.Bytes {
		t.Errorf("object ETag %q, size %d: want a 2-part multipart ETag and %d bytes", info.ETag, info.Size, res.Bytes)
	}
	for _, want := range ts {
		ti, err := r.Head(ctx, uri+"#"+want.Name)
		if err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, ti.Size)
		if err := r.Fetch(ctx, ti, dst); err != nil {
			t.Fatal(err)
		}
		if sum(dst) != res.SHA256[want.Name] {
			t.Errorf("%s read back with sha256 %s, written %s", want.Name, sum(dst), res.SHA256[want.Name])
		}
	}
	// Small outputs stay one PUT.
	tp.reset()
	if _, err := r.Write(ctx, "s3://data/t/small.safetensors", []storage.OutTensor{tensor("x", 4, 4, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	if got := tp.matching(""); len(got) != 1 || !strings.HasPrefix(got[0], "PUT /data/t/small.safetensors") {
		t.Errorf("a small Write made requests %v, want one PUT", got)
	}
}

// TestLargeObject: a 256 MiB tensor (plus a small one) is written from
// buffers as a multipart upload, then fetched into a buffer; both sides
// are checked against the sha256 recorded in __metadata__.
func TestLargeObject(t *testing.T) { eachServer(t, testLargeObject) }

func testLargeObject(t *testing.T, kind string) {
	if testing.Short() {
		t.Skip("256 MiB object: skipped under -short")
	}
	ctx := context.Background()
	gw := gateway(t, kind)
	st := newStore(t, gw, nil) // default part size (16 MiB)
	r := newRouter(st)
	uri := "s3://data/t/large.safetensors"
	x := tensor("x", 65536, 1024, 11) // 256 MiB
	w := tensor("w", 1, 1024, 12)
	t0 := time.Now()
	res, err := r.Write(ctx, uri, []storage.OutTensor{x, w}, map[string]string{"job": "large"})
	if err != nil {
		t.Fatal(err)
	}
	tw := time.Since(t0)
	ref, _ := storage.ParseRef(uri)
	info, err := st.Stat(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	parts := res.Bytes / (16 << 20) // the header's few bytes ride in the 16 parts, not a 17th
	if m := multipartETag.FindStringSubmatch(info.ETag); m == nil || m[1] != strconv.FormatInt(parts, 10) {
		t.Errorf("ETag %q: want a %d-part multipart upload", info.ETag, parts)
	}
	if info.Size != res.Bytes || res.Bytes <= 256<<20 {
		t.Errorf("object is %d bytes, Write reported %d", info.Size, res.Bytes)
	}
	t0 = time.Now()
	ti, err := r.Head(ctx, uri+"#x")
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, ti.Size)
	if err := r.Fetch(ctx, ti, dst); err != nil {
		t.Fatal(err)
	}
	tr := time.Since(t0)
	if got := sum(dst); got != sum(x.Data) || got != res.SHA256["x"] {
		t.Fatalf("256 MiB tensor read back with sha256 %s, want %s", got, sum(x.Data))
	}
	// The sha256 in the object's own header agrees.
	hdr := make([]byte, ti.Offset)
	if err := st.ReadAt(ctx, ref, "", hdr, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(hdr, []byte(`"sha256.x":"`+sum(x.Data)+`"`)) {
		t.Error("the header's __metadata__ lacks the sha256 of x")
	}
	t.Logf("256 MiB: write %v (%.0f MB/s), head+fetch %v (%.0f MB/s)", tw, float64(res.Bytes)/tw.Seconds()/1e6, tr, float64(ti.Size)/tr.Seconds()/1e6)
}

// TestWrongCredentials: a bad secret or access key is a permanent
// ErrAccess after one request, and the error never holds a secret.
func TestWrongCredentials(t *testing.T) { eachServer(t, testWrongCredentials) }

func testWrongCredentials(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	good := newRouter(newStore(t, gw, nil))
	if _, err := good.Write(ctx, "s3://data/t/c.safetensors", []storage.OutTensor{tensor("x", 4, 4, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	const badSecret = "not-the-secret-0123456789"
	for name, edit := range map[string]func(*s3.Config){
		"secret": func(c *s3.Config) { c.SecretKey = badSecret },
		"access": func(c *s3.Config) { c.AccessKey = "nosuchaccesskey" },
	} {
		t.Run(name, func(t *testing.T) {
			tp := newTap()
			r := newRouter(newStore(t, gw, func(c *s3.Config) { edit(c); c.Transport = tp }))
			_, err := r.Head(ctx, "s3://data/t/c.safetensors#x")
			_, werr := r.Write(ctx, "s3://data/t/c2.safetensors", []storage.OutTensor{tensor("x", 4, 4, 1)}, nil)
			for _, err := range []error{err, werr} {
				if !errors.Is(err, storage.ErrAccess) || !storage.Permanent(err) {
					t.Errorf("with a wrong %s key: %v, want permanent ErrAccess", name, err)
					continue
				}
				for _, secret := range []string{badSecret, gw.SecretKey} {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("error holds a secret: %v", err)
					}
				}
				if !strings.Contains(err.Error(), "credentials") || !strings.Contains(err.Error(), "s3://data/t/c") {
					t.Errorf("error does not say what to check or which URI: %v", err)
				}
			}
			// HEAD (and, for a 404 without a body, the 1-byte GET that reads
			// the error code), then one PUT: nothing retried.
			if got := tp.matching(""); len(got) > 3 || len(tp.matching("PUT ")) != 1 {
				t.Errorf("requests %v: want one HEAD (+ one GET) and one PUT, not retried", got)
			}
		})
	}
}

// TestMissingBucketAndKey: a missing bucket (allow-listed but absent) and a
// missing key are permanent ErrNotFound after one request each.
func TestMissingBucketAndKey(t *testing.T) { eachServer(t, testMissingBucketAndKey) }

func testMissingBucketAndKey(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	tp := newTap()
	st := newStore(t, gw, func(c *s3.Config) { c.Transport = tp })
	r := newRouter(st)
	for uri, code := range map[string]string{"s3://nobucket/k.safetensors#x": "NoSuchBucket", "s3://data/t/absent.safetensors#x": "NoSuchKey"} {
		tp.reset()
		_, err := r.Head(ctx, uri)
		if !errors.Is(err, storage.ErrNotFound) || !storage.Permanent(err) || !strings.Contains(err.Error(), uri) || !strings.Contains(err.Error(), code) {
			t.Errorf("Head(%s) = %v, want permanent ErrNotFound naming the URI and %s", uri, err, code)
		}
		if got := tp.matching(""); len(got) != 1 || !strings.HasSuffix(got[0], "bytes=0-65535") {
			t.Errorf("Head(%s) made requests %v, want one GET, not retried", uri, got)
		}
		// Stat is a HEAD, whose 404 has no body: a 1-byte GET reads the
		// server's error code, so a missing bucket is still named.
		ref, _ := storage.ParseRef(uri)
		tp.reset()
		_, err = st.Stat(ctx, ref)
		if !errors.Is(err, storage.ErrNotFound) || !strings.Contains(err.Error(), code) {
			t.Errorf("Stat(%s) = %v, want ErrNotFound naming %s", uri, err, code)
		}
		if got := tp.matching(""); len(got) != 2 || !strings.HasPrefix(got[0], "HEAD ") || !strings.HasSuffix(got[1], "bytes=0-0") {
			t.Errorf("Stat(%s) made requests %v, want one HEAD and one GET of bytes=0-0", uri, got)
		}
	}
	tp.reset()
	_, err := r.Write(ctx, "s3://nobucket/out.safetensors", []storage.OutTensor{tensor("x", 4, 4, 1)}, nil)
	if !errors.Is(err, storage.ErrNotFound) || !storage.Permanent(err) || !strings.Contains(err.Error(), "NoSuchBucket") {
		t.Errorf("Write to a missing bucket = %v, want permanent ErrNotFound (NoSuchBucket)", err)
	}
	if n := len(tp.matching("")); n != 1 {
		t.Errorf("Write to a missing bucket made %d requests, want 1", n)
	}
}

// TestOddKeys: keys with spaces, plus signs, unicode and other characters
// S3 allows round-trip, so the read signer's canonical path matches the
// server's (every GET and HEAD here is signed by sign.go).
func TestOddKeys(t *testing.T) { eachServer(t, testOddKeys) }

func testOddKeys(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	r := newRouter(newStore(t, gw, nil))
	for _, key := range []string{"t/a b+c.safetensors", "t/ünï/cødé.safetensors", "t/x=1&y=2;(z)!*'~,$@.safetensors", "t/UPPER/-_.safetensors"} {
		uri := "s3://data/" + key
		x := tensor("x", 4, 8, 1)
		if _, err := r.Write(ctx, uri, []storage.OutTensor{x}, nil); err != nil {
			t.Fatalf("Write %q: %v", key, err)
		}
		ti, err := r.Head(ctx, uri)
		if err != nil {
			t.Fatalf("Head %q: %v", key, err)
		}
		dst := make([]byte, ti.Size)
		if err := r.Fetch(ctx, ti, dst); err != nil || !bytes.Equal(dst, x.Data) {
			t.Fatalf("Fetch %q: %v", key, err)
		}
	}
}

// TestSmallObjectOneRequest: Head of a small object is one GET of its
// first 64 KiB, which brings the tensor too: Fetch makes no request. An
// empty or truncated object is a permanent ErrFormat.
func TestSmallObjectOneRequest(t *testing.T) { eachServer(t, testSmallObjectOneRequest) }

func testSmallObjectOneRequest(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	tp := newTap()
	st := newStore(t, gw, func(c *s3.Config) { c.Transport = tp })
	r := newRouter(st)
	uri := "s3://data/t/small1.safetensors"
	x, w := tensor("x", 8, 1024, 40), tensor("w", 1, 1024, 41) // 32 KiB + 4 KiB
	if _, err := r.Write(ctx, uri, []storage.OutTensor{x, w}, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []storage.OutTensor{x, w} {
		tp.reset()
		ti, err := r.Head(ctx, uri+"#"+want.Name)
		if err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, ti.Size)
		if err := r.Fetch(ctx, ti, dst); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst, want.Data) {
			t.Errorf("%s: other bytes", want.Name)
		}
		if got := tp.matching(""); len(got) != 1 {
			t.Errorf("Head+Fetch of %s in a small object made requests %v, want one", want.Name, got)
		}
	}
	for name, body := range map[string][]byte{"empty": nil, "short": []byte("abc"), "bad-len": {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'}} {
		u := "s3://data/t/" + name + ".safetensors"
		if err := r.Put(ctx, u, bytes.NewReader(body), int64(len(body))); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Head(ctx, u); !errors.Is(err, storage.ErrFormat) || !storage.Permanent(err) {
			t.Errorf("Head of a %s object = %v, want permanent ErrFormat", name, err)
		}
	}
}

// TestMultipartChecksum: a multipart Write sends a CRC32C of every part
// (as minio-go's own multipart upload does, which the Write benchmark
// compares with) and the server records their composite on the object.
func TestMultipartChecksum(t *testing.T) { eachServer(t, testMultipartChecksum) }

func testMultipartChecksum(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	st := newStore(t, gw, func(c *s3.Config) { c.PartSize, c.MultipartThreshold = 5<<20, 5<<20 })
	r := newRouter(st)
	if _, err := r.Write(ctx, "s3://data/t/mp-crc.safetensors", []storage.OutTensor{tensor("dx", 3000, 1024, 7)}, nil); err != nil {
		t.Fatal(err)
	}
	oi, err := st.Client().StatObject(ctx, "data", "t/mp-crc.safetensors", minio.StatObjectOptions{Checksum: true})
	if err != nil {
		t.Fatal(err)
	}
	if m := multipartETag.FindStringSubmatch(oi.ETag); m == nil || m[1] != "2" {
		t.Errorf("ETag %q: want a 2-part multipart upload", oi.ETag)
	}
	if oi.ChecksumCRC32C == "" {
		t.Errorf("the object has no CRC32C checksum (ETag %q, checksum mode %q): the parts went up without one", oi.ETag, oi.ChecksumMode)
	}
}

// TestPartChecksumChecked: the server checks the CRC32C header a
// multipart part carries (the store's parts send theirs in a header, not
// a trailer): a part whose bytes do not match is refused.
func TestPartChecksumChecked(t *testing.T) { eachServer(t, testPartChecksumChecked) }

func testPartChecksumChecked(t *testing.T, kind string) {
	ctx := context.Background()
	gw := gateway(t, kind)
	st := newStore(t, gw, nil)
	core := minio.Core{Client: st.Client()}
	id, err := core.NewMultipartUpload(ctx, "data", "t/badpart", minio.PutObjectOptions{UserMetadata: map[string]string{"x-amz-checksum-algorithm": "CRC32C"}})
	if err != nil {
		t.Fatal(err)
	}
	defer core.AbortMultipartUpload(ctx, "data", "t/badpart", id)
	data := bytes.Repeat([]byte("rmsgrad"), 1000)
	good := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))
	for _, c := range []struct {
		sum uint32
		ok  bool
	}{{good, true}, {good ^ 1, false}} {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], c.sum)
		hdr := http.Header{"X-Amz-Checksum-Crc32c": []string{base64.StdEncoding.EncodeToString(b[:])}}
		_, err := core.PutObjectPart(ctx, "data", "t/badpart", id, 1, bytes.NewReader(data), int64(len(data)), minio.PutObjectPartOptions{DisableContentSha256: true, CustomHeader: hdr})
		if (err == nil) != c.ok {
			t.Errorf("part with CRC32C %08x (right: %08x): err = %v", c.sum, good, err)
		}
	}
}
