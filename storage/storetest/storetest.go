// Package storetest is the conformance suite every storage.Store runs, in
// the style of litestream's replica client tests: storage/file and
// storage/s3 call Run from their own tests with a constructor, and the same
// assertions hold for both (reads, range reads, writes, atomic replacement,
// not-found, the allow-list, pinned versions and context cancellation).
package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// Fixture is one freshly made store and the URIs the suite may use with it.
type Fixture struct {
	// Store is the store under test, registered with a Router under Scheme.
	Store  storage.Store
	Scheme string
	// Base is a URI prefix ending in "/" below which the store may read and
	// write (for example s3://bucket/prefix/ or file:///root/). Each subtest
	// uses its own names below it.
	Base string
	// Denied are URIs outside the allow-list: Check must refuse them for
	// reading and writing with ErrNotAllowed.
	Denied []string
	// ReadOnly, when not "", is a URI prefix the store may read but not write.
	ReadOnly string
	// MustRefuseUnwritable says the store cannot hold an object at a path
	// that is a directory of other objects, or under another object (a
	// file system; S3 servers backed by one, such as versitygw's posix
	// backend or MinIO): such writes must fail. Others (AWS S3's flat keys)
	// may store them; the suite then only checks that a failure is
	// permanent and clear.
	MustRefuseUnwritable bool
}

// Run runs the suite. newFixture is called once per subtest; it registers
// cleanups on the t it is given.
func Run(t *testing.T, newFixture func(t *testing.T) Fixture) {
	t.Run("WriteHeadFetch", func(t *testing.T) { testWriteHeadFetch(t, newFixture(t)) })
	t.Run("RangeReads", func(t *testing.T) { testRangeReads(t, newFixture(t)) })
	t.Run("ShortObject", func(t *testing.T) { testShortObject(t, newFixture(t)) })
	t.Run("NotFound", func(t *testing.T) { testNotFound(t, newFixture(t)) })
	t.Run("PinnedVersion", func(t *testing.T) { testPinnedVersion(t, newFixture(t)) })
	t.Run("FailedPutKeepsOld", func(t *testing.T) { testFailedPut(t, newFixture(t)) })
	t.Run("AtomicReplace", func(t *testing.T) { testAtomicReplace(t, newFixture(t)) })
	t.Run("AllowList", func(t *testing.T) { testAllowList(t, newFixture(t)) })
	t.Run("Context", func(t *testing.T) { testContext(t, newFixture(t)) })
	t.Run("Unwritable", func(t *testing.T) { testUnwritable(t, newFixture(t)) })
}

// testUnwritable writes where an object can never be: at a path that is a
// directory holding another object, and under a path that is an object.
// A store that refuses must do so at once, permanently, with a message
// naming the URI and why, and no system call's text.
func testUnwritable(t *testing.T, f Fixture) {
	ctx := context.Background()
	r := router(f)
	ts := []storage.OutTensor{f32("x", 1, 4, 1)}
	for _, seed := range []string{"u/dir/inner.safetensors", "u/file"} {
		if _, err := r.Write(ctx, f.Base+seed, ts, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ uri, why string }{
		{f.Base + "u/dir", "directory"},
		{f.Base + "u/file/under.safetensors", "file"},
	} {
		t0 := time.Now()
		_, err := r.Write(ctx, c.uri, ts, nil)
		took := time.Since(t0)
		if err == nil {
			if f.MustRefuseUnwritable {
				t.Errorf("Write(%s) succeeded: want it refused (a %s is in the way)", c.uri, c.why)
			}
			continue
		}
		if !storage.Permanent(err) || took > 5*time.Second {
			t.Errorf("Write(%s) = %v after %v: want a permanent error at once", c.uri, err, took)
		}
		msg := err.Error()
		if !strings.Contains(msg, c.uri) {
			t.Errorf("Write(%s) = %q: the message does not name the URI", c.uri, msg)
		}
		for _, raw := range []string{"renameat", "mkdirat", "openat", "errno", "syscall"} {
			if strings.Contains(msg, raw) {
				t.Errorf("Write(%s) = %q: system call text (%s) in the message", c.uri, msg, raw)
			}
		}
		t.Logf("Write(%s) refused: %v", c.uri, err)
	}
}

func router(f Fixture) *storage.Router {
	r := storage.NewRouter()
	r.Register(f.Scheme, f.Store)
	return r
}

func ref(t *testing.T, uri string) storage.Ref {
	t.Helper()
	r, err := storage.ParseRef(uri)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Pattern returns n deterministic bytes that differ for different seeds and
// at every offset (so a misplaced range shows), for tests of any store.
func Pattern(seed uint64, n int) []byte {
	b := make([]byte, n)
	x := seed*0x9e3779b97f4a7c15 + 1
	i := 0
	for ; i+8 <= n; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < n; i++ {
		b[i] = byte(x >> (8 * (i % 8)))
	}
	return b
}

func f32(name string, rows, cols int, seed uint64) storage.OutTensor {
	return storage.OutTensor{Name: name, DType: "F32", Shape: []int{rows, cols}, Data: f32Bytes(rows*cols, seed)}
}

// f32Bytes returns n finite float32 values (as bytes) from seed.
func f32Bytes(n int, seed uint64) []byte {
	b := Pattern(seed, 4*n)
	for i := 0; i < n; i++ {
		v := binary.LittleEndian.Uint32(b[4*i:])
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v%100000)/7))
	}
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func testWriteHeadFetch(t *testing.T, f Fixture) {
	ctx := context.Background()
	r := router(f)
	uri := f.Base + "whf/out.safetensors"
	ts := []storage.OutTensor{f32("dx", 64, 33, 1), f32("dw", 1, 33, 2), f32("empty", 0, 33, 3), f32("r", 64, 1, 4)}
	res, err := r.Write(ctx, uri, ts, map[string]string{"job": "j1"})
	if err != nil {
		t.Fatal(err)
	}
	info, err := f.Store.Stat(ctx, ref(t, uri))
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != res.Bytes {
		t.Errorf("Stat size %d, Write reported %d", info.Size, res.Bytes)
	}
	// The whole object parses strictly and records each tensor's sha256.
	obj := make([]byte, info.Size)
	if err := f.Store.ReadAt(ctx, ref(t, uri), info.ETag, obj, 0); err != nil {
		t.Fatal(err)
	}
	h, err := safetensors.ReadHeader(bytes.NewReader(obj), int64(len(obj)))
	if err != nil {
		t.Fatalf("written object does not parse: %v", err)
	}
	if h.Metadata["job"] != "j1" {
		t.Errorf("metadata %v lost job=j1", h.Metadata)
	}
	for _, want := range ts {
		if got := h.Metadata[storage.SHA256Key(want.Name)]; got != sum(want.Data) || res.SHA256[want.Name] != got {
			t.Errorf("sha256 of %q: metadata %q, result %q, want %q", want.Name, got, res.SHA256[want.Name], sum(want.Data))
		}
		ti, err := r.Head(ctx, uri+"#"+want.Name)
		if err != nil {
			t.Fatalf("Head %s: %v", want.Name, err)
		}
		if ti.Size != int64(len(want.Data)) || ti.DType != "F32" || fmt.Sprint(ti.Shape) != fmt.Sprint(want.Shape) {
			t.Errorf("Head %s = %+v, want %v %d bytes", want.Name, ti, want.Shape, len(want.Data))
		}
		dst := make([]byte, ti.Size)
		if err := r.Fetch(ctx, ti, dst); err != nil {
			t.Fatalf("Fetch %s: %v", want.Name, err)
		}
		if !bytes.Equal(dst, want.Data) {
			t.Errorf("Fetch %s returned other bytes", want.Name)
		}
	}
	// A single-tensor object needs no #name.
	one := f.Base + "whf/one.safetensors"
	if _, err := r.Write(ctx, one, ts[:1], nil); err != nil {
		t.Fatal(err)
	}
	ti, err := r.Head(ctx, one)
	if err != nil || ti.Size != int64(len(ts[0].Data)) {
		t.Fatalf("Head without #name of a one-tensor object: %+v, %v", ti, err)
	}
	// An output URI names an object, not a tensor.
	if _, err := r.Write(ctx, uri+"#dx", ts[:1], nil); !errors.Is(err, storage.ErrInvalidURI) {
		t.Errorf("Write to a #name URI: %v, want ErrInvalidURI", err)
	}
}

func testRangeReads(t *testing.T, f Fixture) {
	ctx := context.Background()
	r := router(f)
	uri := f.Base + "range/raw.bin"
	data := Pattern(7, 3<<20+13)
	if err := r.Put(ctx, uri, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	rf := ref(t, uri)
	info, err := f.Store.Stat(ctx, rf)
	if err != nil || info.Size != int64(len(data)) {
		t.Fatalf("Stat = %+v, %v; want %d bytes", info, err, len(data))
	}
	for _, c := range []struct{ off, n int }{{0, 1}, {0, 8}, {1, 4095}, {12345, 1 << 20}, {len(data) - 5, 5}, {len(data) / 2, len(data) - len(data)/2}, {0, len(data)}} {
		p := make([]byte, c.n)
		for _, tag := range []string{"", info.ETag} {
			if err := f.Store.ReadAt(ctx, rf, tag, p, int64(c.off)); err != nil {
				t.Fatalf("ReadAt(off %d, n %d, etag %q): %v", c.off, c.n, tag, err)
			}
			if !bytes.Equal(p, data[c.off:c.off+c.n]) {
				t.Fatalf("ReadAt(off %d, n %d) returned other bytes", c.off, c.n)
			}
		}
	}
	if err := f.Store.ReadAt(ctx, rf, "", nil, int64(len(data))); err != nil {
		t.Errorf("empty ReadAt: %v", err)
	}
}

// testShortObject: reads past the end are ErrShortRead, never a silently
// short buffer; a truncated safetensors object is ErrFormat at Head.
func testShortObject(t *testing.T, f Fixture) {
	ctx := context.Background()
	r := router(f)
	uri := f.Base + "short/raw.bin"
	data := Pattern(8, 1000)
	if err := r.Put(ctx, uri, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	rf := ref(t, uri)
	for _, c := range []struct{ off, n int }{{990, 20}, {0, 1001}, {1000, 1}, {5000, 10}} {
		p := bytes.Repeat([]byte{0xAA}, c.n)
		err := f.Store.ReadAt(ctx, rf, "", p, int64(c.off))
		if !errors.Is(err, storage.ErrShortRead) {
			t.Errorf("ReadAt(off %d, n %d) of a %d-byte object = %v, want ErrShortRead", c.off, c.n, len(data), err)
		}
	}
	var obj bytes.Buffer
	ts := []storage.OutTensor{f32("x", 16, 16, 9)}
	if err := safetensors.Encode(&obj, ts, nil); err != nil {
		t.Fatal(err)
	}
	trunc := f.Base + "short/trunc.safetensors"
	b := obj.Bytes()[:obj.Len()-4]
	if err := r.Put(ctx, trunc, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Head(ctx, trunc+"#x"); !errors.Is(err, storage.ErrFormat) || !storage.Permanent(err) || !strings.Contains(err.Error(), trunc) {
		t.Errorf("Head of a truncated object = %v, want a permanent ErrFormat naming %s", err, trunc)
	}
}

func testNotFound(t *testing.T, f Fixture) {
	ctx := context.Background()
	r := router(f)
	missing := f.Base + "nf/absent.safetensors"
	if _, err := f.Store.Stat(ctx, ref(t, missing)); !errors.Is(err, storage.ErrNotFound) || !storage.Permanent(err) {
		t.Errorf("Stat of a missing object = %v, want permanent ErrNotFound", err)
	}
	if err := f.Store.ReadAt(ctx, ref(t, missing), "", make([]byte, 8), 0); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("ReadAt of a missing object = %v, want ErrNotFound", err)
	}
	_, err := r.Head(ctx, missing+"#x")
	if !errors.Is(err, storage.ErrNotFound) || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), `tensor "x"`) {
		t.Errorf("Head of a missing object = %v, want ErrNotFound naming the URI and tensor", err)
	}
	uri := f.Base + "nf/two.safetensors"
	if _, err := r.Write(ctx, uri, []storage.OutTensor{f32("a", 2, 2, 1), f32("b", 2, 2, 2)}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = r.Head(ctx, uri+"#c")
	if !errors.Is(err, storage.ErrNotFound) || !storage.Permanent(err) || !strings.Contains(err.Error(), "it holds: a, b") {
		t.Errorf("Head of a missing tensor = %v, want permanent ErrNotFound listing a, b", err)
	}
	if _, err = r.Head(ctx, uri); !errors.Is(err, storage.ErrNotFound) || !strings.Contains(err.Error(), "name one with #name") {
		t.Errorf("Head without #name of a two-tensor object = %v", err)
	}
	// A tensor of a dtype no worker computes is located but refused,
	// naming what is supported; a half one is located.
	h := f.Base + "nf/half.safetensors"
	if _, err := r.Write(ctx, h, []storage.OutTensor{{Name: "h", DType: "F16", Shape: []int{2}, Data: []byte{0, 0x3c, 0, 0x40}},
		{Name: "d", DType: "F64", Shape: []int{1}, Data: make([]byte, 8)}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Head(ctx, h+"#d"); !errors.Is(err, storage.ErrDType) || !strings.Contains(err.Error(), "supported: F32, BF16, F16") {
		t.Errorf("Head of an F64 tensor = %v, want ErrDType listing F32, BF16, F16", err)
	}
	if ti, err := r.Head(ctx, h+"#h"); err != nil || ti.DType != "F16" || ti.Size != 4 {
		t.Errorf("Head of an F16 tensor = %+v, %v", ti, err)
	}
}

// testPinnedVersion: a Fetch pinned by Head to one version fails with a
// transient ErrChanged after the object is replaced, instead of mixing
// versions; a tensor small enough to come with Head's read of the object's
// start is Head's version, whole.
func testPinnedVersion(t *testing.T, f Fixture) {
	ctx := context.Background()
	r := router(f)
	uri := f.Base + "pin/obj.safetensors"
	const rows, cols = 256, 128 // 128 KiB: more than Head reads
	if _, err := r.Write(ctx, uri, []storage.OutTensor{f32("x", rows, cols, 1), f32("s", 4, 4, 3)}, nil); err != nil {
		t.Fatal(err)
	}
	ti, err := r.Head(ctx, uri+"#x")
	if err != nil {
		t.Fatal(err)
	}
	small, err := r.Head(ctx, uri+"#s")
	if err != nil {
		t.Fatal(err)
	}
	if ti.ETag == "" {
		t.Fatal("Head returned no version tag")
	}
	// Same size, other bytes: only the version tag can tell.
	if _, err := r.Write(ctx, uri, []storage.OutTensor{f32("x", rows, cols, 2), f32("s", 4, 4, 4)}, nil); err != nil {
		t.Fatal(err)
	}
	err = r.Fetch(ctx, ti, make([]byte, ti.Size))
	if !errors.Is(err, storage.ErrChanged) || storage.Permanent(err) {
		t.Errorf("Fetch pinned to a replaced version = %v, want transient ErrChanged", err)
	}
	dst := make([]byte, small.Size)
	if err := r.Fetch(ctx, small, dst); err == nil && !bytes.Equal(dst, f32Bytes(16, 3)) {
		t.Errorf("Fetch of a small tensor after a replacement returned bytes of neither version Head saw")
	} else if err != nil && !errors.Is(err, storage.ErrChanged) {
		t.Errorf("Fetch of a small tensor after a replacement = %v, want Head's bytes or ErrChanged", err)
	}
	ti2, err := r.Head(ctx, uri+"#x")
	if err != nil {
		t.Fatal(err)
	}
	dst = make([]byte, ti2.Size)
	if err := r.Fetch(ctx, ti2, dst); err != nil || !bytes.Equal(dst, f32Bytes(rows*cols, 2)) {
		t.Errorf("Fetch after a new Head: %v (bytes equal %v)", err, bytes.Equal(dst, f32Bytes(rows*cols, 2)))
	}
}

// shortReader yields fewer bytes than Put is told.
type shortReader struct{ r io.Reader }

func (s shortReader) Read(p []byte) (int, error) { return s.r.Read(p) }

func testFailedPut(t *testing.T, f Fixture) {
	ctx := context.Background()
	r := router(f)
	uri := f.Base + "fail/obj.bin"
	old := Pattern(1, 4096)
	if err := r.Put(ctx, uri, bytes.NewReader(old), int64(len(old))); err != nil {
		t.Fatal(err)
	}
	// A body that ends early is refused and the old object stays whole.
	short := Pattern(2, 1<<20)
	if err := r.Put(ctx, uri, shortReader{bytes.NewReader(short[:1000])}, int64(len(short))); err == nil {
		t.Fatal("Put of a body shorter than its size succeeded")
	}
	got := make([]byte, len(old))
	if err := f.Store.ReadAt(ctx, ref(t, uri), "", got, 0); err != nil || !bytes.Equal(got, old) {
		t.Errorf("after a failed Put the object is not the old one: %v", err)
	}
	if info, err := f.Store.Stat(ctx, ref(t, uri)); err != nil || info.Size != int64(len(old)) {
		t.Errorf("after a failed Put: Stat = %+v, %v; want the old %d bytes", info, err, len(old))
	}
	// A failed first write leaves no object at all.
	fresh := f.Base + "fail/new.bin"
	if err := r.Put(ctx, fresh, shortReader{bytes.NewReader(short[:1000])}, int64(len(short))); err == nil {
		t.Fatal("Put of a body shorter than its size succeeded")
	}
	if _, err := f.Store.Stat(ctx, ref(t, fresh)); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("a failed first Put left something behind: Stat = %v", err)
	}
}

// testAtomicReplace: while a writer keeps replacing one object with whole
// new versions, readers (Head then Fetch) see one version's bytes in full
// or a transient ErrChanged, never a mix or a short tensor.
func testAtomicReplace(t *testing.T, f Fixture) {
	ctx := context.Background()
	r := router(f)
	uri := f.Base + "atomic/obj.safetensors"
	const rows, cols = 256, 512 // 512 KiB per version
	versions := map[string]int{}
	var vdata [][]byte
	for v := 0; v < 4; v++ {
		d := f32Bytes(rows*cols, uint64(100+v))
		vdata = append(vdata, d)
		versions[sum(d)] = v
	}
	if _, err := r.Write(ctx, uri, []storage.OutTensor{{Name: "x", DType: "F32", Shape: []int{rows, cols}, Data: vdata[0]}}, nil); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var writes atomic.Int64
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			d := vdata[i%len(vdata)]
			if _, err := r.Write(ctx, uri, []storage.OutTensor{{Name: "x", DType: "F32", Shape: []int{rows, cols}, Data: d}}, nil); err != nil {
				werr = err
				return
			}
			writes.Add(1)
		}
	}()
	var reads, changed int
	seen := map[int]bool{}
	deadline := time.Now().Add(1500 * time.Millisecond)
	dst := make([]byte, rows*cols*4)
	for time.Now().Before(deadline) || reads < 20 {
		if reads > 2000 {
			break
		}
		ti, err := r.Head(ctx, uri+"#x")
		if errors.Is(err, storage.ErrChanged) {
			changed++
			continue
		}
		if err != nil {
			t.Fatalf("Head during replacement: %v", err)
		}
		clear(dst)
		err = r.Fetch(ctx, ti, dst)
		if errors.Is(err, storage.ErrChanged) {
			changed++
			continue
		}
		if err != nil {
			t.Fatalf("Fetch during replacement: %v", err)
		}
		v, ok := versions[sum(dst)]
		if !ok {
			t.Fatalf("read %d saw bytes of no version: a half-written or mixed object", reads)
		}
		seen[v] = true
		reads++
	}
	close(stop)
	wg.Wait()
	if werr != nil {
		t.Fatalf("writer: %v", werr)
	}
	t.Logf("%d whole reads (%d versions seen), %d ErrChanged, %d writes", reads, len(seen), changed, writes.Load())
	if writes.Load() < 2 {
		t.Errorf("only %d writes happened during the reads: the test proved nothing", writes.Load())
	}
}

func testAllowList(t *testing.T, f Fixture) {
	ctx := context.Background()
	r := router(f)
	ts := []storage.OutTensor{f32("x", 1, 4, 1)}
	for _, uri := range f.Denied {
		for _, write := range []bool{false, true} {
			if err := r.Check(uri, write); !errors.Is(err, storage.ErrNotAllowed) || !storage.Permanent(err) {
				t.Errorf("Check(%s, write=%v) = %v, want permanent ErrNotAllowed", uri, write, err)
			}
		}
		if _, err := r.Head(ctx, uri+"#x"); !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Head(%s) = %v, want ErrNotAllowed", uri, err)
		}
		if _, err := r.Write(ctx, uri, ts, nil); !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Write(%s) = %v, want ErrNotAllowed", uri, err)
		}
		if err := r.Put(ctx, uri, bytes.NewReader([]byte("x")), 1); !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Put(%s) = %v, want ErrNotAllowed", uri, err)
		}
	}
	// ".." never reaches a store: the URI itself is refused, and a Ref
	// built by hand with a ".." segment is refused by the store.
	dotdot := f.Base + "a/../../x"
	if err := r.Check(dotdot, false); !errors.Is(err, storage.ErrInvalidURI) || !storage.Permanent(err) {
		t.Errorf("Check(%s) = %v, want ErrInvalidURI", dotdot, err)
	}
	base := ref(t, f.Base+"a")
	base.Key = strings.TrimSuffix(base.Key, "a") + "a/../../x"
	if err := f.Store.Check(base, false); err == nil || !storage.Permanent(err) {
		t.Errorf("Store.Check(%+v) with a .. segment = %v, want a permanent error", base, err)
	}
	if err := r.Check(f.Base+"ok/x.safetensors", true); err != nil {
		t.Errorf("Check of an allowed URI: %v", err)
	}
	if f.ReadOnly != "" {
		ro := f.ReadOnly + "x.safetensors"
		if err := r.Check(ro, false); err != nil {
			t.Errorf("Check(%s, read) = %v, want allowed", ro, err)
		}
		if err := r.Check(ro, true); !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Check(%s, write) = %v, want ErrNotAllowed", ro, err)
		}
		if _, err := r.Write(ctx, ro, ts, nil); !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Write(%s) = %v, want ErrNotAllowed", ro, err)
		}
	}
}

func testContext(t *testing.T, f Fixture) {
	r := router(f)
	uri := f.Base + "ctx/obj.safetensors"
	if _, err := r.Write(context.Background(), uri, []storage.OutTensor{f32("x", 64, 64, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rf := ref(t, uri)
	if _, err := f.Store.Stat(ctx, rf); !errors.Is(err, context.Canceled) {
		t.Errorf("Stat with a cancelled context = %v", err)
	}
	if err := f.Store.ReadAt(ctx, rf, "", make([]byte, 16), 0); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadAt with a cancelled context = %v", err)
	}
	if _, err := r.Head(ctx, uri+"#x"); !errors.Is(err, context.Canceled) || storage.Permanent(err) {
		t.Errorf("Head with a cancelled context = %v, want context.Canceled, not permanent", err)
	}
	other := f.Base + "ctx/new.safetensors"
	if _, err := r.Write(ctx, other, []storage.OutTensor{f32("x", 64, 64, 1)}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Write with a cancelled context = %v", err)
	}
	if _, err := f.Store.Stat(context.Background(), ref(t, other)); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("a cancelled Write left an object: Stat = %v", err)
	}
}
