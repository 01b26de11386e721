package file

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rmsgrad/rmsgrad/storage"
)

// chunk bounds each read and write so that a cancelled ctx stops a large
// transfer within one chunk.
const chunk = 8 << 20

// Store is the local-disk store rooted at one directory.
type Store struct {
	roots []string // the root as configured (absolute, clean) and with symlinks resolved
	root  *os.Root
	rules []Rule // nil: the whole root, read and write
}

var _ storage.Store = (*Store)(nil)

// Rule opens the paths under Prefix, relative to the store's root, for
// reading, and for writing unless ReadOnly: the file store's counterpart of
// the S3 allow-list. A path matches when its part below the root starts
// with Prefix (end it with "/" to mean a directory: "in/" matches "in/a"
// but not "inputs/a"). With rules, a path no rule matches can be neither
// read nor written, and an output path may not go through a symbolic link
// to a directory (it could lead into a read-only prefix).
type Rule struct {
	Prefix   string
	ReadOnly bool
}

// New opens the store rooted at root, the allow-listed directory: only
// paths below it can be read or written, and, with rules, only those the
// rules open (see Rule).
func New(root string, rules ...Rule) (*Store, error) {
	for i, r := range rules {
		p := strings.TrimSuffix(r.Prefix, "/")
		if r.Prefix == "" || strings.HasPrefix(r.Prefix, "/") || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") {
			return nil, fmt.Errorf("file store rule %d: prefix %q must be a clean path relative to the root (for example \"in/\")", i, r.Prefix)
		}
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("file store root %q: %w", root, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("file store root %q: %w", root, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return nil, fmt.Errorf("file store root %q: %w", root, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("file store root %q: not a directory", root)
	}
	r, err := os.OpenRoot(real)
	if err != nil {
		return nil, fmt.Errorf("file store root %q: %w", root, err)
	}
	s := &Store{roots: []string{abs}, root: r, rules: rules}
	if real != abs {
		s.roots = append(s.roots, real)
	}
	return s, nil
}

// Root returns the root directory as configured (absolute).
func (s *Store) Root() string { return s.roots[0] }

// Close releases the root directory handle.
func (s *Store) Close() error { return s.root.Close() }

// rel returns ref's path relative to the root, or ErrNotAllowed.
func (s *Store) rel(ref storage.Ref) (string, error) {
	if ref.Scheme != "file" {
		return "", storage.Errorf(storage.ErrInvalidURI, "the file store serves file:// URIs, not %s://", ref.Scheme)
	}
	p := ref.Key
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return "", storage.Errorf(storage.ErrNotAllowed, "path %q is not absolute and clean", p)
	}
	for _, root := range s.roots {
		if rel, ok := strings.CutPrefix(p, root+"/"); ok && rel != "" {
			return rel, nil
		}
		if root == "/" && p != "/" {
			return p[1:], nil
		}
	}
	return "", storage.Errorf(storage.ErrNotAllowed, "path is outside the file store root %s (storage.file_root)", s.roots[0])
}

// Check applies the root and the rules to ref without I/O (symlinks are
// checked on open).
func (s *Store) Check(ref storage.Ref, write bool) error {
	rel, err := s.rel(ref)
	if err != nil || s.rules == nil {
		return err
	}
	readable := false
	for _, r := range s.rules {
		if !strings.HasPrefix(rel, r.Prefix) {
			continue
		}
		if !write || !r.ReadOnly {
			return nil
		}
		readable = true
	}
	if readable {
		return storage.Errorf(storage.ErrNotAllowed, "path %s is in a read-only prefix of the file store (storage.file_allow)", ref.Key)
	}
	if write {
		return storage.Errorf(storage.ErrNotAllowed, "path %s is outside the prefixes this worker may write under the file store root (storage.file_allow)", ref.Key)
	}
	return storage.Errorf(storage.ErrNotAllowed, "path %s is outside the prefixes this worker may read under the file store root (storage.file_allow)", ref.Key)
}

// checkWritePath refuses an output path whose directories go through a
// symbolic link, when rules are set: a link in a writable prefix could
// lead into a read-only one. Directories that do not exist yet are fine
// (Put makes them).
func (s *Store) checkWritePath(rel string) error {
	if s.rules == nil {
		return nil
	}
	dir := path.Dir(rel)
	if dir == "." {
		return nil
	}
	p := ""
	for _, seg := range strings.Split(dir, "/") {
		p = path.Join(p, seg)
		fi, err := s.root.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return classify(err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return storage.Errorf(storage.ErrNotAllowed, "output path goes through the symbolic link %s: with write rules (storage.file_allow) outputs may not", path.Join(s.roots[0], p))
		}
	}
	return nil
}

// unwritable explains a failed write of rel, when the cause is one no retry
// can fix: rel is an existing directory, or one of its parents is a
// regular file. Else it returns err as it was.
func (s *Store) unwritable(rel string, err error) error {
	full := func(p string) string { return "file://" + path.Join(s.roots[0], p) }
	if fi, lerr := s.root.Lstat(rel); lerr == nil && fi.IsDir() {
		return storage.Errorf(storage.ErrNotWritable, "output path %s is an existing directory, which an object cannot replace", full(rel))
	}
	p := ""
	for _, seg := range strings.Split(path.Dir(rel), "/") {
		if seg == "." {
			break
		}
		p = path.Join(p, seg)
		fi, lerr := s.root.Lstat(p)
		if lerr != nil {
			break
		}
		if fi.Mode().IsRegular() {
			return storage.Errorf(storage.ErrNotWritable, "output path %s lies under %s, which is a regular file, not a directory", full(rel), full(p))
		}
	}
	return err
}

// classify maps an os error to the storage sentinels.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case strings.Contains(err.Error(), "path escapes from parent"):
		return fmt.Errorf("%w: a symlink or .. leads outside the file store root: %v", storage.ErrNotAllowed, err)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: %v", storage.ErrNotFound, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: %v", storage.ErrAccess, err)
	}
	return err
}

func etag(fi fs.FileInfo) string {
	var ino uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = uint64(st.Ino)
	}
	return fmt.Sprintf("%x-%x-%x", fi.Size(), fi.ModTime().UnixNano(), ino)
}

// Stat returns the file's size and a version tag (size, mtime, inode).
func (s *Store) Stat(ctx context.Context, ref storage.Ref) (storage.ObjectInfo, error) {
	rel, err := s.rel(ref)
	if err != nil {
		return storage.ObjectInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return storage.ObjectInfo{}, err
	}
	fi, err := s.root.Stat(rel)
	if err != nil {
		return storage.ObjectInfo{}, classify(err)
	}
	if !fi.Mode().IsRegular() {
		return storage.ObjectInfo{}, storage.Errorf(storage.ErrNotFound, "not a regular file")
	}
	return storage.ObjectInfo{Size: fi.Size(), ETag: etag(fi)}, nil
}

// ReadAt fills p from the file at off, straight from the page cache into p.
func (s *Store) ReadAt(ctx context.Context, ref storage.Ref, tag string, p []byte, off int64) error {
	rel, err := s.rel(ref)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := s.root.Open(rel)
	if err != nil {
		return classify(err)
	}
	defer f.Close()
	if tag != "" {
		fi, err := f.Stat()
		if err != nil {
			return classify(err)
		}
		if etag(fi) != tag {
			return storage.Errorf(storage.ErrChanged, "file was replaced after its header was read")
		}
	}
	for done := 0; done < len(p); {
		if err := ctx.Err(); err != nil {
			return err
		}
		end := min(len(p), done+chunk)
		n, err := f.ReadAt(p[done:end], off+int64(done))
		done += n
		if err == io.EOF || (err == nil && n == 0) {
			return storage.Errorf(storage.ErrShortRead, "file ended after %d of %d bytes at offset %d", done, len(p), off)
		}
		if err != nil && done < end {
			return classify(err)
		}
	}
	return nil
}

// Put writes size bytes from r to a temp file beside the target, fsyncs it
// and renames it over the target.
func (s *Store) Put(ctx context.Context, ref storage.Ref, r io.Reader, size int64) (err error) {
	rel, err := s.rel(ref)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.checkWritePath(rel); err != nil {
		return err
	}
	dir := path.Dir(rel)
	if dir != "." {
		if err := s.root.MkdirAll(dir, 0o755); err != nil {
			return s.unwritable(rel, classify(err))
		}
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(dir, "."+path.Base(rel)+".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := s.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return s.unwritable(rel, classify(err))
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = s.root.Remove(tmp)
		}
	}()
	w := &ctxWriter{ctx: ctx, w: f}
	var n int64
	if wt, ok := r.(io.WriterTo); ok {
		n, err = wt.WriteTo(w)
	} else {
		n, err = io.CopyBuffer(w, io.LimitReader(r, size+1), make([]byte, 256<<10))
	}
	if err != nil {
		return fmt.Errorf("write temp file: %w", classify(err))
	}
	if n != size {
		return fmt.Errorf("body has %d bytes, want %d", n, size)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("close temp file: %w", err)
	}
	if err = s.root.Rename(tmp, rel); err != nil {
		_ = s.root.Remove(tmp)
		return s.unwritable(rel, classify(err))
	}
	// Make the rename itself durable.
	if d, derr := s.root.Open(dir); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c *ctxWriter) Write(p []byte) (int, error) {
	total := 0
	for total < len(p) {
		if err := c.ctx.Err(); err != nil {
			return total, err
		}
		n, err := c.w.Write(p[total:min(len(p), total+chunk)])
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
