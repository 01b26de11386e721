package file_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/file"
	"github.com/rmsgrad/rmsgrad/storage/storetest"
)

func newStore(t *testing.T) (*file.Store, string) {
	t.Helper()
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, s.Root()
}

// TestConformance runs the suite every store passes: on the whole root,
// and with write rules (a read-write and a read-only prefix).
func TestConformance(t *testing.T) {
	for _, rules := range []bool{false, true} {
		name := "root"
		if rules {
			name = "rules"
		}
		t.Run(name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Fixture {
				dir := t.TempDir()
				var rs []file.Rule
				base := "file://" + dir + "/"
				if rules {
					rs = []file.Rule{{Prefix: "rw/"}, {Prefix: "ro/", ReadOnly: true}}
					base += "rw/"
				}
				s, err := file.New(dir, rs...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				outside := t.TempDir()
				if err := os.WriteFile(filepath.Join(outside, "x"), []byte("secret"), 0o644); err != nil {
					t.Fatal(err)
				}
				f := storetest.Fixture{
					Store:                s,
					Scheme:               "file",
					Base:                 base,
					Denied:               []string{"file://" + outside + "/x", "file:///etc/passwd", "file://" + dir + "-sibling/x"},
					MustRefuseUnwritable: true,
				}
				if rules {
					f.ReadOnly = "file://" + dir + "/ro/"
					f.Denied = append(f.Denied, "file://"+dir+"/other/x", "file://"+dir+"/rwx/x")
				}
				return f
			})
		})
	}
}

// TestRules: with rules, a job cannot overwrite another's inputs (a
// read-only prefix), nor reach them through a symbolic link in a writable
// prefix; reads of the read-only prefix work; bad rules fail at New.
func TestRules(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "in"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "in", "x.safetensors"), []byte("input"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "out"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../in", filepath.Join(dir, "out", "link")); err != nil {
		t.Fatal(err)
	}
	s, err := file.New(dir, file.Rule{Prefix: "in/", ReadOnly: true}, file.Rule{Prefix: "out/"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := storage.NewRouter()
	r.Register("file", s)
	in := "file://" + dir + "/in/x.safetensors"
	if err := r.Check(in, false); err != nil {
		t.Errorf("reading the read-only prefix: %v", err)
	}
	for _, uri := range []string{in, "file://" + dir + "/in/new.safetensors", "file://" + dir + "/elsewhere.safetensors"} {
		err := r.Put(ctx, uri, strings.NewReader("out"), 3)
		if !errors.Is(err, storage.ErrNotAllowed) || !storage.Permanent(err) || !strings.Contains(err.Error(), "storage.file_allow") {
			t.Errorf("Put(%s) = %v, want a permanent ErrNotAllowed naming storage.file_allow", uri, err)
		}
	}
	viaLink := "file://" + dir + "/out/link/x.safetensors"
	if err := r.Put(ctx, viaLink, strings.NewReader("out"), 3); !errors.Is(err, storage.ErrNotAllowed) || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("Put through a link into the read-only prefix = %v, want ErrNotAllowed naming the link", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "in", "x.safetensors")); string(b) != "input" {
		t.Fatalf("the input was overwritten: %q", b)
	}
	if err := r.Put(ctx, "file://"+dir+"/out/a/y.safetensors", strings.NewReader("out"), 3); err != nil {
		t.Errorf("Put in the writable prefix: %v", err)
	}
	for _, bad := range []string{"", "/abs/", "../up/", "a/../b", "./x"} {
		if _, err := file.New(dir, file.Rule{Prefix: bad}); err == nil {
			t.Errorf("file.New with prefix %q succeeded", bad)
		}
	}
}

// TestUnwritablePaths: an output path that is a directory, or lies under a
// regular file, fails at once and for good, naming the path and why.
func TestUnwritablePaths(t *testing.T) {
	ctx := context.Background()
	s, root := newStore(t)
	r := storage.NewRouter()
	r.Register("file", s)
	if err := os.MkdirAll(filepath.Join(root, "adir", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "afile"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ uri, why string }{
		{"file://" + root + "/adir", "is an existing directory"},
		{"file://" + root + "/afile/out.safetensors", "lies under file://" + root + "/afile, which is a regular file"},
		{"file://" + root + "/afile/deeper/out.safetensors", "which is a regular file"},
	} {
		err := r.Put(ctx, c.uri, strings.NewReader("out"), 3)
		if !errors.Is(err, storage.ErrNotWritable) || !storage.Permanent(err) || !strings.Contains(err.Error(), c.why) || !strings.Contains(err.Error(), c.uri) {
			t.Errorf("Put(%s) = %v, want permanent ErrNotWritable naming the path and %q", c.uri, err, c.why)
		}
		if strings.Contains(err.Error(), "renameat") || strings.Contains(err.Error(), "mkdirat") {
			t.Errorf("Put(%s) = %v: system call text in the message", c.uri, err)
		}
	}
}

// TestPutTempAndRename: a write goes to a hidden temp file beside the
// target and is renamed over it; a failed or cancelled write leaves no temp
// file and no target behind.
func TestPutTempAndRename(t *testing.T) {
	ctx := context.Background()
	s, root := newStore(t)
	ref, _ := storage.ParseRef("file://" + root + "/d/out.bin")
	data := storetest.Pattern(1, 20<<20) // > one 8 MiB chunk, so the body is written in pieces
	var sawTemp bool
	body := &peekReader{r: bytes.NewReader(data), after: 10 << 20, peek: func() {
		ents, _ := os.ReadDir(filepath.Join(root, "d"))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".out.bin.tmp-") {
				sawTemp = true
			}
			if e.Name() == "out.bin" {
				t.Error("the target exists before the write finished")
			}
		}
	}}
	if err := s.Put(ctx, ref, body, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if !sawTemp {
		t.Error("no temp file was seen during the write")
	}
	got, err := os.ReadFile(filepath.Join(root, "d/out.bin"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("target after Put: %v (equal %v)", err, bytes.Equal(got, data))
	}
	// Cancelled mid-write: no temp, old target unchanged.
	cctx, cancel := context.WithCancel(ctx)
	body = &peekReader{r: bytes.NewReader(storetest.Pattern(2, len(data))), after: 10 << 20, peek: cancel}
	if err := s.Put(cctx, ref, body, int64(len(data))); !errors.Is(err, context.Canceled) {
		t.Errorf("Put cancelled mid-write = %v, want context.Canceled", err)
	}
	ents, _ := os.ReadDir(filepath.Join(root, "d"))
	if len(ents) != 1 || ents[0].Name() != "out.bin" {
		t.Errorf("after a cancelled Put the directory holds %v, want only out.bin", ents)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "d/out.bin")); !bytes.Equal(got, data) {
		t.Error("a cancelled Put changed the target")
	}
	// A body longer than its size is refused too.
	long := storetest.Pattern(3, 100)
	if err := s.Put(ctx, ref, io.MultiReader(bytes.NewReader(long)), 50); err == nil {
		t.Error("Put of a body longer than its size succeeded")
	}
	if got, _ := os.ReadFile(filepath.Join(root, "d/out.bin")); !bytes.Equal(got, data) {
		t.Error("a refused Put changed the target")
	}
}

// TestSymlinks: relative links that stay inside the root are followed;
// links that leave it, and absolute links, are ErrNotAllowed, for reads and
// for writes into a linked directory.
func TestSymlinks(t *testing.T) {
	ctx := context.Background()
	s, root := newStore(t)
	outside := t.TempDir()
	_ = os.WriteFile(filepath.Join(outside, "secret"), []byte("0123456789abcdef"), 0o644)
	_ = os.WriteFile(filepath.Join(root, "inside"), []byte("0123456789abcdef"), 0o644)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("inside", filepath.Join(root, "in-link")))
	// os.Root refuses absolute links even when they point inside the root.
	must(os.Symlink(filepath.Join(root, "inside"), filepath.Join(root, "abs-link")))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "out-link")))
	must(os.Symlink(outside, filepath.Join(root, "out-dir")))
	must(os.Symlink("../"+filepath.Base(outside)+"/secret", filepath.Join(root, "rel-link")))
	ref := func(p string) storage.Ref { r, _ := storage.ParseRef("file://" + root + "/" + p); return r }
	p := make([]byte, 16)
	if err := s.ReadAt(ctx, ref("in-link"), "", p, 0); err != nil || string(p) != "0123456789abcdef" {
		t.Errorf("read through a link inside the root: %q, %v", p, err)
	}
	for _, name := range []string{"out-link", "out-dir/secret", "rel-link", "abs-link"} {
		if _, err := s.Stat(ctx, ref(name)); !errors.Is(err, storage.ErrNotAllowed) || !storage.Permanent(err) {
			t.Errorf("Stat(%s) = %v, want permanent ErrNotAllowed", name, err)
		}
		if err := s.ReadAt(ctx, ref(name), "", p, 0); !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("ReadAt(%s) = %v, want ErrNotAllowed", name, err)
		}
	}
	if err := s.Put(ctx, ref("out-dir/new"), bytes.NewReader([]byte("x")), 1); !errors.Is(err, storage.ErrNotAllowed) {
		t.Errorf("Put into a linked directory outside the root = %v, want ErrNotAllowed", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); !os.IsNotExist(err) {
		t.Error("a write through a link created a file outside the root")
	}
}

type peekReader struct {
	r     io.Reader
	n     int
	after int
	peek  func()
	done  bool
}

func (p *peekReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += n
	if !p.done && p.n >= p.after {
		p.done = true
		p.peek()
	}
	return n, err
}
