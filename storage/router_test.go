package storage_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

func fileRouter(t *testing.T) (*storage.Router, string) {
	t.Helper()
	dir := t.TempDir()
	fs, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	r := storage.NewRouter()
	r.Register("file", fs)
	return r, fs.Root()
}

func TestParseRef(t *testing.T) {
	good := map[string]storage.Ref{
		"s3://b/k/x.safetensors#dy": {Scheme: "s3", Bucket: "b", Key: "k/x.safetensors", Name: "dy"},
		"s3://b/k":                  {Scheme: "s3", Bucket: "b", Key: "k"},
		"file:///data/in.st#x":      {Scheme: "file", Key: "/data/in.st", Name: "x"},
	}
	for uri, want := range good {
		got, err := storage.ParseRef(uri)
		if err != nil || got != want {
			t.Errorf("ParseRef(%q) = %+v, %v; want %+v", uri, got, err, want)
		}
		if got.String() != uri {
			t.Errorf("String() = %q, want %q", got.String(), uri)
		}
	}
	for _, uri := range []string{"", "b/k", "http://b/k", "s3://b", "s3:///k", "s3://b/", "s3://b/a/../k",
		"s3://b/a//k", "s3://user:secret@b/k", "file://host/x", "file:///a/./b", "file:///a/../etc/passwd",
		"s3://b/k#", "s3://b/k?x=1", "s3://b/k%2e", "s3://b/k\n"} {
		_, err := storage.ParseRef(uri)
		if !errors.Is(err, storage.ErrInvalidURI) || !storage.Permanent(err) {
			t.Errorf("ParseRef(%q) = %v, want ErrInvalidURI", uri, err)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("error leaks credentials: %v", err)
		}
	}
}

func TestRouterFile(t *testing.T) {
	ctx := context.Background()
	r, dir := fileRouter(t)
	uri := "file://" + dir + "/sub/io.safetensors"
	x := make([]float32, 64*33)
	for i := range x {
		x[i] = float32(i) * 0.5
	}
	res, err := r.Write(ctx, uri, []storage.OutTensor{
		safetensors.F32("x", []int{64, 33}, x),
		safetensors.F32("w", []int{33}, x[:33]),
		{Name: "h", DType: "F16", Shape: []int{2}, Data: []byte{0, 0x3c, 0, 0x40}},
		{Name: "d", DType: "F64", Shape: []int{1}, Data: make([]byte, 8)},
	}, map[string]string{"run": "t"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.SHA256) != 4 || len(res.SHA256["x"]) != 64 {
		t.Fatalf("sha256s %v", res.SHA256)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "sub/io.safetensors")); fi == nil || fi.Size() != res.Bytes {
		t.Fatalf("file size %v, want %d", fi, res.Bytes)
	}
	got := fetchF32(t, r, uri+"#x", []int{64, 33})
	for i := range got {
		if got[i] != x[i] {
			t.Fatalf("x[%d] = %v, want %v", i, got[i], x[i])
		}
	}
	if w := fetchF32(t, r, uri+"#w", []int{33}); w[32] != x[32] {
		t.Fatalf("w[32] = %v", w[32])
	}
	h, err := r.Head(ctx, uri+"#h")
	if err != nil || h.DType != "F16" || h.Size != 4 {
		t.Fatalf("F16 head: %+v, %v", h, err)
	}
	hb := make([]byte, h.Size)
	if err := r.Fetch(ctx, h, hb); err != nil || !bytes.Equal(hb, []byte{0, 0x3c, 0, 0x40}) {
		t.Fatalf("F16 fetch: %v, %v", hb, err)
	}
	_, err = r.Head(ctx, uri+"#d")
	if !errors.Is(err, storage.ErrDType) || !strings.Contains(err.Error(), "supported: F32, BF16, F16") || !strings.Contains(err.Error(), `tensor "d"`) {
		t.Errorf("F64 head: %v", err)
	}
	if _, err = r.Head(ctx, uri); !errors.Is(err, storage.ErrNotFound) || !strings.Contains(err.Error(), "holds 4 tensors") {
		t.Errorf("head without a name: %v", err)
	}
	if _, err = r.Head(ctx, uri+"#nope"); !errors.Is(err, storage.ErrNotFound) || !strings.Contains(err.Error(), uri+"#nope") {
		t.Errorf("missing tensor: %v", err)
	}
	if _, err = r.Head(ctx, "file://"+dir+"/absent"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("missing file: %v", err)
	}
	info, _ := r.Head(ctx, uri+"#x")
	if err := r.Fetch(ctx, info, make([]byte, info.Size-1)); err == nil {
		t.Error("fetch into a short buffer succeeded")
	}
	// Replacing the object between Head and Fetch is detected, not mixed.
	if _, err := r.Write(ctx, uri, []storage.OutTensor{safetensors.F32("x", []int{64, 33}, make([]float32, 64*33))}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Fetch(ctx, info, make([]byte, info.Size)); !errors.Is(err, storage.ErrChanged) || storage.Permanent(err) {
		t.Errorf("fetch of a replaced object: %v, want transient ErrChanged", err)
	}
	// A truncated object is a format error naming the sizes.
	p := filepath.Join(dir, "trunc.safetensors")
	b, _ := os.ReadFile(filepath.Join(dir, "sub/io.safetensors"))
	_ = os.WriteFile(p, b[:len(b)-4], 0o644)
	if _, err := r.Head(ctx, "file://"+p+"#x"); !errors.Is(err, storage.ErrFormat) || !strings.Contains(err.Error(), "but the object is") {
		t.Errorf("truncated: %v", err)
	}
	// Put uploads raw bytes.
	if err := r.Put(ctx, "file://"+dir+"/raw.safetensors", bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	if err := r.Put(ctx, "file://"+dir+"/raw2", bytes.NewReader(b), int64(len(b))+1); err == nil {
		t.Error("put of a short body succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "raw2")); !os.IsNotExist(err) {
		t.Error("a failed put left a file behind")
	}
}

func TestRouterAllowList(t *testing.T) {
	ctx := context.Background()
	r, dir := fileRouter(t)
	outside := t.TempDir()
	_ = os.WriteFile(filepath.Join(outside, "secret"), []byte("xxxxxxxxxxxxxxxx"), 0o644)
	if err := os.Symlink(outside, filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "leak")); err != nil {
		t.Fatal(err)
	}
	for _, uri := range []string{"file://" + outside + "/secret", "file:///etc/passwd"} {
		if err := r.Check(uri, false); !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Check(%s) = %v", uri, err)
		}
	}
	if err := r.Check("file://"+dir+"/../x", false); !errors.Is(err, storage.ErrInvalidURI) {
		t.Errorf(".. : %v", err)
	}
	if err := r.Check("s3://b/k", false); !errors.Is(err, storage.ErrNotAllowed) {
		t.Errorf("unconfigured scheme: %v", err)
	}
	for _, uri := range []string{"file://" + dir + "/escape/secret", "file://" + dir + "/leak"} {
		_, err := r.Head(ctx, uri)
		if !errors.Is(err, storage.ErrNotAllowed) || !storage.Permanent(err) {
			t.Errorf("Head(%s) through a symlink out of the root = %v, want ErrNotAllowed", uri, err)
		}
	}
	// Writing into a symlinked directory that leaves the root is refused.
	_, err := r.Write(ctx, "file://"+dir+"/escape/out", []storage.OutTensor{safetensors.F32("x", []int{1}, []float32{1})}, nil)
	if !errors.Is(err, storage.ErrNotAllowed) {
		t.Errorf("Write through an escaping directory link = %v, want ErrNotAllowed", err)
	}
	// Writing over a symlink replaces the link (rename), never its target.
	if _, err := r.Write(ctx, "file://"+dir+"/leak", []storage.OutTensor{safetensors.F32("x", []int{1}, []float32{1})}, nil); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "leak")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("leak is %v, %v; want a regular file inside the root", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "xxxxxxxxxxxxxxxx" {
		t.Error("a write through a symlink changed a file outside the root")
	}
}

// TestMaxHeaderBytes: a Router configured below the format's 100 MB cap
// refuses longer headers with ErrTooLarge naming the limit.
func TestMaxHeaderBytes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fs, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	uri := "file://" + fs.Root() + "/meta.safetensors"
	meta := map[string]string{"big": strings.Repeat("m", 4000)}
	w := storage.NewRouter()
	w.Register("file", fs)
	if _, err := w.Write(ctx, uri, []storage.OutTensor{safetensors.F32("x", []int{2}, []float32{1, 2})}, meta); err != nil {
		t.Fatal(err)
	}
	r := storage.NewRouter(storage.WithMaxHeaderBytes(1024))
	r.Register("file", fs)
	if _, err := r.Head(ctx, uri+"#x"); !errors.Is(err, storage.ErrTooLarge) || !strings.Contains(err.Error(), "1024") {
		t.Errorf("Head of a 4 KB header under a 1 KiB limit = %v, want ErrTooLarge naming 1024", err)
	}
	if _, err := w.Head(ctx, uri+"#x"); err != nil {
		t.Errorf("Head without a limit: %v", err)
	}
}

// TestTakeInline: a small tensor that Head's read holds is handed over
// once, with its exact bytes; after that Fetch still reads it (from the
// object) and a second TakeInline declines.
func TestTakeInline(t *testing.T) {
	ctx := context.Background()
	r, dir := fileRouter(t)
	uri := "file://" + dir + "/small.safetensors"
	x := make([]float32, 8*16)
	for i := range x {
		x[i] = float32(i) - 7.25
	}
	if _, err := r.Write(ctx, uri, []storage.OutTensor{safetensors.F32("x", []int{8, 16}, x)}, nil); err != nil {
		t.Fatal(err)
	}
	info, err := r.Head(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Inline() {
		t.Fatal("a 512-byte tensor is not held by Head's read")
	}
	want := make([]byte, info.Size)
	if err := r.Fetch(ctx, info, want); err != nil { // takes the held bytes: a copy
		t.Fatal(err)
	}
	if _, _, ok := info.TakeInline(); ok || info.Inline() {
		t.Fatal("TakeInline handed over bytes that Fetch had taken")
	}
	// A second object: the file store's Head of an object whose header is
	// cached reads no bytes.
	uri2 := "file://" + dir + "/small2.safetensors"
	if _, err := r.Write(ctx, uri2, []storage.OutTensor{safetensors.F32("x", []int{8, 16}, x)}, nil); err != nil {
		t.Fatal(err)
	}
	if info, err = r.Head(ctx, uri2); err != nil {
		t.Fatal(err)
	}
	data, release, ok := info.TakeInline()
	if !ok || !bytes.Equal(data, want) {
		t.Fatalf("TakeInline: ok %v, %d bytes equal to the tensor's: %v", ok, len(data), bytes.Equal(data, want))
	}
	if _, _, again := info.TakeInline(); again {
		t.Fatal("a second TakeInline handed the same bytes over again")
	}
	release()
	got := make([]byte, info.Size)
	if err := r.Fetch(ctx, info, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("Fetch after TakeInline: %v, equal %v", err, bytes.Equal(got, want))
	}
}

// TestWriteWithSHA256: digests handed to Write are recorded as given (in
// the result and the header), both for a small object (hashed before the
// upload) and a large one (hashed beside it), and a count that does not
// match the tensors is an error that writes nothing.
func TestWriteWithSHA256(t *testing.T) {
	ctx := context.Background()
	r, dir := fileRouter(t)
	for _, n := range []int{16, 300 << 10} { // 64 B and 1.2 MB of data
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i % 97)
		}
		ts := []storage.OutTensor{safetensors.F32("a", []int{n}, v), safetensors.F32("b", []int{n / 2}, v[:n/2])}
		uri := fmt.Sprintf("file://%s/sums-%d.safetensors", dir, n)
		plain, err := r.Write(ctx, uri, ts, nil)
		if err != nil {
			t.Fatal(err)
		}
		given := [][sha256.Size]byte{sha256.Sum256(ts[0].Data), {1, 2, 3}} // the second deliberately not b's
		wr, err := r.Write(ctx, uri, ts, nil, storage.WithSHA256(given))
		if err != nil {
			t.Fatal(err)
		}
		if wr.SHA256["a"] != plain.SHA256["a"] || wr.SHA256["b"] != hex.EncodeToString(given[1][:]) || wr.Bytes != plain.Bytes {
			t.Fatalf("%d: result %v, want a's real digest and b's given one", n, wr.SHA256)
		}
		raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("sums-%d.safetensors", n)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(raw, []byte(hex.EncodeToString(given[1][:]))) {
			t.Fatalf("%d: the header does not record the given digest", n)
		}
		if _, err := r.Write(ctx, uri+"x", ts, nil, storage.WithSHA256(given[:1])); err == nil {
			t.Fatalf("%d: one digest for two tensors accepted", n)
		}
		if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("sums-%d.safetensorsx", n))); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%d: a refused Write left an object: %v", n, err)
		}
	}
}

// TestHeaderBudget: a header whose parse would take more than the whole
// header budget is refused at once, naming the budget; one within it is
// read (and not cached, since it holds budget only while parsed).
func TestHeaderBudget(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fs, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	meta := map[string]string{"pad": strings.Repeat("p", 100<<10)} // a 100 KiB header
	uri := "file://" + dir + "/big.safetensors"
	w := storage.NewRouter()
	w.Register("file", fs)
	if _, err := w.Write(ctx, uri, []storage.OutTensor{safetensors.F32("x", []int{2}, []float32{1, 2})}, meta); err != nil {
		t.Fatal(err)
	}
	cost := safetensors.ParseCost(100<<10 + 200)
	small := storage.NewRouter(storage.WithHeaderBudget(cost / 2))
	small.Register("file", fs)
	_, err = small.Head(ctx, uri+"#x")
	if !errors.Is(err, storage.ErrTooLarge) || !storage.Permanent(err) || !strings.Contains(err.Error(), "header budget of") {
		t.Fatalf("Head with a header over the budget = %v, want a permanent ErrTooLarge naming the header budget", err)
	}
	enough := storage.NewRouter(storage.WithHeaderBudget(2 * cost))
	enough.Register("file", fs)
	if _, err := enough.Head(ctx, uri+"#x"); err != nil {
		t.Fatalf("Head within the budget: %v", err)
	}
}
