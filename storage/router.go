package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"

	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// SupportedDTypes are the dtypes the workers compute (compute.DTypes, as
// safetensors names them); Head rejects others with ErrDType naming these.
var SupportedDTypes = []string{"F32", "BF16", "F16"}

// SHA256Key returns the __metadata__ key under which Write records the
// sha256 (lowercase hex) of tensor name's bytes.
func SHA256Key(name string) string { return "sha256." + name }

// headProbe is how many bytes Head reads first: the length prefix and, for
// every header our writers produce (a few hundred bytes), the whole JSON, so
// a Head costs one stat and one small GET.
const headProbe = 64 << 10

// TensorInfo is one tensor located by Head: what Fetch needs to read it.
type TensorInfo struct {
	Ref    Ref
	DType  string
	Shape  []int
	Offset int64  // absolute byte offset of the tensor in the object
	Size   int64  // length in bytes
	ETag   string // the object version the header came from; Fetch pins its read to it
	// ObjectSize is the size of the whole object (0 when unknown).
	ObjectSize int64

	// inline holds the tensor's bytes when Head's read of the object's
	// start held them (a small object): the first Fetch copies them from
	// there and gives the read buffer back to the pool.
	inline *inlined
}

// probePool holds Head's 64 KiB read buffers. x and dy are new objects for
// every job, so without it each Head allocated (and the runtime zeroed) a
// fresh 64 KiB: half of a small job's allocated bytes.
var probePool = sync.Pool{New: func() any { b := make([]byte, headProbe); return &b }}

func getProbe(n int64) (*[]byte, []byte) {
	bp := probePool.Get().(*[]byte)
	return bp, (*bp)[:n]
}

func putProbe(bp *[]byte) {
	if bp != nil {
		probePool.Put(bp)
	}
}

// inlined is a tensor's bytes inside a pooled probe buffer. Exactly one
// caller takes them (take: a Fetch that copies them out and returns the
// buffer, or TakeInline, whose caller returns it); a later or concurrent
// Fetch of the same TensorInfo reads the object instead, so a returned
// buffer is never read again (only the winner of taken touches data and
// buf). A TensorInfo never fetched leaves its buffer to the garbage
// collector.
type inlined struct {
	taken atomic.Bool
	data  []byte
	buf   *[]byte
}

// OutTensor is one tensor to write: Data holds prod(Shape) little-endian
// elements of DType (the compute buffer's bytes, sent without a copy).
type OutTensor = safetensors.Tensor

// WriteResult is what Write stored.
type WriteResult struct {
	SHA256 map[string]string // tensor name -> sha256 of its bytes (lowercase hex)
	Bytes  int64             // the object's size
}

// Router sends each URI to the Store of its scheme. It is safe for
// concurrent use once its stores are registered.
type Router struct {
	mu        sync.RWMutex
	stores    map[string]Store
	cache     *headerCache
	flights   *flights // nil: WithSharedReads(false)
	maxHeader int64    // 0: the format's cap, safetensors.MaxHeaderSize
	hdrBudget *headerBudget
}

// chargeOver is the header length above which Head charges a header's
// parse to the header budget and does not cache it: writers' headers are a
// few hundred bytes, and an uncharged parse allocates at most
// safetensors.ParseCost(chargeOver), 160 KiB.
const chargeOver = 4 << 10

// defaultHeaderBudget is the header budget unless WithHeaderBudget says
// otherwise.
const defaultHeaderBudget = 64 << 20

// headerBudget bounds the memory of the headers being read and parsed at
// once: each over chargeOver holds safetensors.ParseCost of its length
// until it is parsed.
type headerBudget struct {
	capacity int64
	sem      *semaphore.Weighted
}

// WithHeaderBudget bounds the bytes that the headers Head reads and parses
// at once may take (each header over 4 KiB is charged
// safetensors.ParseCost(length) while it is read and parsed; shorter ones
// are not charged and are what the header cache keeps). A header whose cost
// exceeds the whole budget is ErrTooLarge; others wait for their turn. The
// default is 64 MiB, which admits one header of 1 MiB (ParseCost 40 MiB).
func WithHeaderBudget(n int64) Option {
	return func(r *Router) {
		if n <= 0 {
			n = defaultHeaderBudget
		}
		r.hdrBudget = &headerBudget{capacity: n, sem: semaphore.NewWeighted(n)}
	}
}

// WithMaxHeaderBytes caps the JSON header length Head accepts below the
// format's own 100 MB (safetensors.MaxHeaderSize). Every header Head reads
// is held in memory whole, outside any tensor budget, and kept in the
// header cache, so a reader serving untrusted jobs should bound it: the
// inputs of a job have headers of a few hundred bytes. n <= 0 keeps the
// format's cap. Over the cap is ErrTooLarge.
func WithMaxHeaderBytes(n int64) Option {
	return func(r *Router) { r.maxHeader = n }
}

// Option configures a Router.
type Option func(*Router)

// WithHeaderCache keeps the parsed headers of the last n objects (validated
// by size and ETag on each Head), so Heads of x, w and dy in one object read
// its header once. n <= 0 turns the cache off; the default is 64.
func WithHeaderCache(n int) Option {
	return func(r *Router) {
		if n <= 0 {
			r.cache = nil
			return
		}
		r.cache = newHeaderCache(n)
	}
}

// NewRouter returns a Router with no stores; Register adds them.
func NewRouter(opts ...Option) *Router {
	r := &Router{stores: map[string]Store{}, cache: newHeaderCache(64), flights: &flights{m: map[string]*flight{}}}
	WithHeaderBudget(defaultHeaderBudget)(r)
	for _, o := range opts {
		o(r)
	}
	return r
}

// Register serves URIs of scheme ("s3", "file") from s, replacing any store
// registered for it before.
func (r *Router) Register(scheme string, s Store) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stores[scheme] = s
}

func (r *Router) route(op, uri string, write bool) (Ref, Store, error) {
	ref, err := ParseRef(uri)
	if err != nil {
		var se *Error
		if errors.As(err, &se) {
			se.Op = op
		}
		return Ref{}, nil, err
	}
	s, err := r.routeRef(op, ref, write)
	return ref, s, err
}

// routeRef is route for a Ref already parsed (Fetch's, from Head): the
// store of its scheme, and that store's allow-list check.
func (r *Router) routeRef(op string, ref Ref, write bool) (Store, error) {
	r.mu.RLock()
	s := r.stores[ref.Scheme]
	r.mu.RUnlock()
	if s == nil {
		return nil, &Error{Op: op, URI: ref.String(), Tensor: ref.Name,
			Err: errorf(ErrNotAllowed, "no store is configured for %s:// URIs on this host", ref.Scheme)}
	}
	if err := s.Check(ref, write); err != nil {
		return nil, wrap(op, ref, err)
	}
	return s, nil
}

// Check parses uri and applies its store's allow-list for reading or (write)
// writing, without any I/O: ErrInvalidURI or ErrNotAllowed. Symlinks are
// checked when the file store opens the path.
func (r *Router) Check(uri string, write bool) error {
	ref, _, err := r.route("check", uri, write)
	if err == nil && write && ref.Name != "" {
		return &Error{Op: "check", URI: ref.String(), Tensor: ref.Name,
			Err: errorf(ErrInvalidURI, "an output URI names an object, not a tensor: drop #%s", ref.Name)}
	}
	return err
}

// Head reads the header of uri's object (or takes it from the cache after
// checking the object's size and ETag), validates it strictly and returns
// where the named tensor lies. Without a #name the object must hold exactly
// one tensor. A tensor whose dtype is not computed is ErrDType naming the
// supported ones.
func (r *Router) Head(ctx context.Context, uri string) (TensorInfo, error) {
	ref, s, err := r.route("head", uri, false)
	if err != nil {
		return TensorInfo{}, err
	}
	h, etag, prefix, buf, err := r.header(ctx, s, ref)
	if err != nil {
		putProbe(buf)
		return TensorInfo{}, wrap("head", ref, err)
	}
	keep := false
	defer func() {
		if !keep {
			putProbe(buf)
		}
	}()
	var e safetensors.Entry
	if ref.Name == "" {
		if len(h.Entries) != 1 {
			return TensorInfo{}, &Error{Op: "head", URI: ref.String(),
				Err: errorf(ErrNotFound, "the object holds %d tensors (%s); name one with #name", len(h.Entries), strings.Join(h.Names(), ", "))}
		}
		e = h.Entries[0]
	} else {
		var ok bool
		if e, ok = h.Lookup(ref.Name); !ok {
			return TensorInfo{}, &Error{Op: "head", URI: ref.String(), Tensor: ref.Name,
				Err: errorf(ErrNotFound, "no such tensor in the object (it holds: %s)", strings.Join(h.Names(), ", "))}
		}
	}
	if !supported(e.DType) {
		return TensorInfo{}, &Error{Op: "head", URI: ref.String(), Tensor: e.Name,
			Err: errorf(ErrDType, "dtype %s (supported: %s)", e.DType, strings.Join(SupportedDTypes, ", "))}
	}
	t := TensorInfo{Ref: ref, DType: e.DType, Shape: append([]int(nil), e.Shape...),
		Offset: h.DataStart + e.Begin, Size: e.Size(), ETag: etag, ObjectSize: h.Size}
	if t.Size > 0 && t.Offset+t.Size <= int64(len(prefix)) {
		// The header read already holds this (small) tensor: Fetch copies it
		// instead of making a second request for a few KiB.
		t.inline = &inlined{data: prefix[t.Offset : t.Offset+t.Size : t.Offset+t.Size], buf: buf}
		keep = true
	}
	return t, nil
}

// Inline reports whether Head's read of the object's start already holds
// t's bytes, so that the first Fetch is a copy and makes no request.
func (t TensorInfo) Inline() bool { return t.inline != nil && !t.inline.taken.Load() }

// TakeInline hands over the bytes of t that Head's read of the object's
// start holds, instead of Fetch copying them: data is t's bytes inside a
// pooled buffer, and release gives that buffer back (call it once, when
// data is no longer used; until then nothing else touches the buffer).
// ok is false when t has no such bytes or they were taken already (by
// TakeInline or Fetch); Fetch then reads the tensor as usual.
func (t TensorInfo) TakeInline() (data []byte, release func(), ok bool) {
	data, buf, ok := t.take()
	if !ok {
		return nil, nil, false
	}
	return data, func() { putProbe(buf) }, true
}

// take claims t's held bytes and the pooled buffer behind them, once.
func (t TensorInfo) take() ([]byte, *[]byte, bool) {
	in := t.inline
	if in == nil || !in.taken.CompareAndSwap(false, true) {
		return nil, nil, false
	}
	data := in.data
	in.data = nil
	return data, in.buf, true
}

func supported(dtype string) bool {
	for _, d := range SupportedDTypes {
		if d == dtype {
			return true
		}
	}
	return false
}

// header returns the object's parsed header and version, and the prefix of
// the object it read on the way (nil when the header came from the cache
// after a Stat) with the pooled buffer that holds it (nil when none), which
// the caller gives back with putProbe once done with the prefix, also on
// error.
func (r *Router) header(ctx context.Context, s Store, ref Ref) (*safetensors.Header, string, []byte, *[]byte, error) {
	key := ref.Object().String()
	// An object seen before and larger than the probe costs a HEAD to
	// validate its cached header; any other object one GET of its first
	// 64 KiB (the whole object when it is small), when the store can.
	probeLen := int64(headProbe)
	if size, seen := r.cache.size(key); seen {
		probeLen = min(size, headProbe)
		if size > headProbe {
			probeLen = 0
		}
	}
	if _, ok := s.(PrefixReader); !ok || probeLen < safetensors.PrefixSize || r.flights == nil {
		return r.readHeader(ctx, s, ref, key, probeLen)
	}
	// Heads of one object that overlap (the w that every job of a layer
	// shares) share one read: see flights.
	f, done, leader := r.flights.join(key)
	if !leader {
		return r.follow(ctx, f, done, s, ref, key, probeLen)
	}
	h, etag, probe, buf, err := r.readHeader(ctx, s, ref, key, probeLen)
	r.flights.finish(key, f, h, etag, probe, err)
	return h, etag, probe, buf, err
}

// readHeader is header without sharing: it reads the object's start (or
// Stats it when probeLen is 0 or the store cannot read a prefix) and parses
// or looks up its header.
func (r *Router) readHeader(ctx context.Context, s Store, ref Ref, key string, probeLen int64) (*safetensors.Header, string, []byte, *[]byte, error) {
	var info ObjectInfo
	var probe []byte
	var buf *[]byte
	if pr, ok := s.(PrefixReader); ok && probeLen >= safetensors.PrefixSize {
		buf, probe = getProbe(probeLen)
		n, i, err := pr.ReadPrefix(ctx, ref, probe)
		if err != nil {
			return nil, "", nil, buf, err
		}
		info, probe = i, probe[:n]
		if h := r.cache.get(key, info); h != nil {
			return h, info.ETag, probe, buf, nil
		}
	} else {
		var err error
		if info, err = s.Stat(ctx, ref); err != nil {
			return nil, "", nil, nil, err
		}
		if h := r.cache.get(key, info); h != nil {
			return h, info.ETag, nil, nil, nil
		}
	}
	if info.Size < safetensors.PrefixSize {
		return nil, "", nil, buf, errorf(ErrFormat, "object of %d bytes is shorter than the 8-byte header length prefix", info.Size)
	}
	if probe == nil {
		buf, probe = getProbe(min(info.Size, headProbe))
		if err := s.ReadAt(ctx, ref, info.ETag, probe, 0); err != nil {
			return nil, "", nil, buf, err
		}
	}
	if int64(len(probe)) < min(info.Size, safetensors.PrefixSize) {
		return nil, "", nil, buf, errorf(ErrShortRead, "read %d bytes of the object's start, want %d", len(probe), min(info.Size, safetensors.PrefixSize))
	}
	n, err := safetensors.HeaderLength(probe, info.Size)
	if err != nil {
		return nil, "", nil, buf, err
	}
	if r.maxHeader > 0 && n > r.maxHeader {
		return nil, "", nil, buf, errorf(ErrTooLarge, "header length %d exceeds the header limit of %d bytes (WithMaxHeaderBytes: the worker's limits.max_header_bytes)", n, r.maxHeader)
	}
	if n > chargeOver {
		cost := safetensors.ParseCost(n)
		if cost > r.hdrBudget.capacity {
			return nil, "", nil, buf, errorf(ErrTooLarge, "a header of %d bytes takes %d bytes to read and parse, over the whole header budget of %d bytes this reader is configured with", n, cost, r.hdrBudget.capacity)
		}
		if err := r.hdrBudget.sem.Acquire(ctx, cost); err != nil {
			return nil, "", nil, buf, err
		}
		defer r.hdrBudget.sem.Release(cost)
	}
	hdr := probe[safetensors.PrefixSize:]
	if int64(len(hdr)) >= n {
		hdr = hdr[:n]
	} else {
		// A header larger than the probe (many tensors or much metadata):
		// read the rest, pinned to the same version.
		full := make([]byte, n)
		copy(full, hdr)
		if err := s.ReadAt(ctx, ref, info.ETag, full[len(hdr):], safetensors.PrefixSize+int64(len(hdr))); err != nil {
			return nil, "", nil, buf, err
		}
		hdr = full
	}
	// The parsed header copies what it keeps (names, dtypes): it must not
	// point into the pooled probe.
	h, err := safetensors.ParseHeader(hdr, info.Size)
	if err != nil {
		return nil, "", nil, buf, err
	}
	if n <= chargeOver {
		r.cache.put(key, info, h) // a large header is read again: the cache holds no budget
	}
	return h, info.ETag, probe, buf, nil
}

// Fetch reads tensor t (from Head) straight into dst, which must be exactly
// t.Size bytes: one range read, no intermediate copy. The read is pinned to
// the object version Head saw (ErrChanged if it was replaced since). A
// tensor that Head's read of the object's first 64 KiB already held (a
// small object) is copied from there without a request.
func (r *Router) Fetch(ctx context.Context, t TensorInfo, dst []byte) error {
	s, err := r.routeRef("fetch", t.Ref, false)
	if err != nil {
		return err
	}
	if int64(len(dst)) != t.Size {
		return &Error{Op: "fetch", URI: t.Ref.String(), Tensor: t.Ref.Name,
			Err: fmt.Errorf("destination buffer is %d bytes, the tensor is %d", len(dst), t.Size)}
	}
	if t.Size == 0 {
		return nil
	}
	if data, buf, ok := t.take(); ok {
		copy(dst, data) // len(data) == t.Size == len(dst), set by Head
		putProbe(buf)
		return nil
	}
	if sr, ok := s.(SizedReader); ok && t.ObjectSize > 0 {
		return wrap("fetch", t.Ref, sr.ReadAtSized(ctx, t.Ref, t.ETag, dst, t.Offset, t.ObjectSize))
	}
	return wrap("fetch", t.Ref, s.ReadAt(ctx, t.Ref, t.ETag, dst, t.Offset))
}

// Write stores ts as one safetensors object at uri, atomically: readers see
// the old object or the whole new one. The sha256 of each tensor's bytes is
// recorded in __metadata__ under SHA256Key(name), beside meta. Tensor bytes
// stream from ts[i].Data with a known content length; nothing is copied.
//
// WithSHA256 hands over digests the caller already has, which Write then
// records as they are.
func (r *Router) Write(ctx context.Context, uri string, ts []OutTensor, meta map[string]string, opts ...WriteOption) (WriteResult, error) {
	ref, s, err := r.route("write", uri, true)
	if err != nil {
		return WriteResult{}, err
	}
	if ref.Name != "" {
		return WriteResult{}, &Error{Op: "write", URI: ref.String(), Tensor: ref.Name,
			Err: errorf(ErrInvalidURI, "an output URI names an object, not a tensor: drop #%s", ref.Name)}
	}
	var o writeOpts
	for _, opt := range opts {
		opt(&o)
	}
	if o.sums != nil && len(o.sums) != len(ts) {
		return WriteResult{}, &Error{Op: "write", URI: ref.String(),
			Err: fmt.Errorf("%d precomputed digests for %d tensors", len(o.sums), len(ts))}
	}
	res := WriteResult{SHA256: make(map[string]string, len(ts))}
	all := make(map[string]string, len(meta)+len(ts))
	for k, v := range meta {
		all[k] = v
	}
	var data int64
	for _, t := range ts {
		data += int64(len(t.Data))
	}
	digest := func(i int, t OutTensor) {
		var sum [sha256.Size]byte
		if o.sums != nil {
			sum = o.sums[i]
		} else {
			sum = sha256.Sum256(t.Data)
		}
		h := hex.EncodeToString(sum[:])
		res.SHA256[t.Name] = h
		all[SHA256Key(t.Name)] = h
	}
	var body *Segments
	if data <= inlineHashMax {
		// A small object goes up in one request that starts with the
		// header: nothing to overlap the hashing with, so hash first and
		// encode the header once.
		for i, t := range ts {
			digest(i, t)
		}
		hdr, err := safetensors.EncodeHeader(ts, all)
		if err != nil {
			return WriteResult{}, wrap("write", ref, err)
		}
		body = newBody(hdr, ts)
	} else {
		// Hex sha256s have a fixed length, so the header's size is known
		// before any hashing: encode it with placeholder digests (this also
		// validates names, dtypes and sizes), give the store a body whose
		// header bytes wait for the real digests, and hash while the store
		// sends the tensor bytes. The S3 store uploads parts 2..N of a
		// large object while part 1 waits for the header; a store that
		// reads in order (a single PUT, a file) waits for the hashes as it
		// would anyway.
		for _, t := range ts {
			all[SHA256Key(t.Name)] = placeholderSHA256
		}
		hdr, err := safetensors.EncodeHeader(ts, all)
		if err != nil {
			return WriteResult{}, wrap("write", ref, err)
		}
		body = newBody(hdr, ts)
		body.gate, body.gateEnd = make(chan struct{}), int64(len(hdr))
		go func() {
			defer close(body.gate)
			for i, t := range ts {
				digest(i, t)
			}
			final, err := safetensors.EncodeHeader(ts, all)
			if err == nil && len(final) != len(hdr) {
				err = fmt.Errorf("header with digests is %d bytes, with placeholders %d", len(final), len(hdr))
			}
			if err != nil {
				body.gateErr = err
				return
			}
			copy(hdr, final)
		}()
	}
	res.Bytes = body.Size()
	err = s.Put(ctx, ref, body, res.Bytes)
	if body.gate != nil {
		<-body.gate // res and the header are the hashing goroutine's until then
		if err == nil {
			err = body.gateErr
		}
	}
	if err != nil {
		return WriteResult{}, wrap("write", ref, err)
	}
	r.cache.drop(ref.Object().String())
	return res, nil
}

// WriteOption adjusts one Write.
type WriteOption func(*writeOpts)

type writeOpts struct {
	sums [][sha256.Size]byte
}

// WithSHA256 gives Write the sha256 of each tensor's bytes (sums[i] for
// ts[i]), computed by the caller, so Write does not hash them again: the
// worker hashes a batch's outputs two at a time (internal/sha256x2).
// Write records them as given; a wrong digest is the caller's bug.
func WithSHA256(sums [][sha256.Size]byte) WriteOption {
	return func(o *writeOpts) { o.sums = sums }
}

// inlineHashMax is the most tensor bytes Write hashes before handing the
// body to the store rather than beside the upload: an object this small
// goes in one request (S3's smallest multipart part is 5 MiB), which waits
// for the header, so hashing beside it saves nothing.
const inlineHashMax = 1 << 20

// newBody is the object's bytes: the header, then each tensor's data.
func newBody(hdr []byte, ts []OutTensor) *Segments {
	segs := make([][]byte, 0, 1+len(ts))
	segs = append(segs, hdr)
	for _, t := range ts {
		segs = append(segs, t.Data)
	}
	return NewSegments(segs...)
}

// placeholderSHA256 stands in for a digest while Write hashes: as long as
// a hex sha256, so the header does not change size.
var placeholderSHA256 = strings.Repeat("0", 2*sha256.Size)

// Put uploads size bytes from body as the object at uri, atomically (the
// CLI uploads local safetensors files with it). The bytes are not parsed;
// a later Head checks them. A body that is also an io.Seeker (an *os.File)
// can be retried after a transient failure.
func (r *Router) Put(ctx context.Context, uri string, body io.Reader, size int64) error {
	ref, s, err := r.route("put", uri, true)
	if err != nil {
		return err
	}
	if ref.Name != "" {
		return &Error{Op: "put", URI: ref.String(), Tensor: ref.Name,
			Err: errorf(ErrInvalidURI, "an upload URI names an object, not a tensor: drop #%s", ref.Name)}
	}
	if size < 0 {
		return &Error{Op: "put", URI: ref.String(), Err: fmt.Errorf("size must be known (got %d)", size)}
	}
	if err := s.Put(ctx, ref, body, size); err != nil {
		return wrap("put", ref, err)
	}
	r.cache.drop(ref.Object().String())
	return nil
}

// Segments is an io.Reader, io.ReaderAt and io.Seeker over byte slices laid
// end to end, without copying them: Write sends the header and the compute
// buffers through it, and stores can re-read it from the start to retry or
// upload multipart parts in parallel.
type Segments struct {
	segs [][]byte
	ends []int64 // cumulative end offsets
	off  int64

	// When gate is not nil, reads of bytes before gateEnd wait until it is
	// closed (Write fills the header in meanwhile) and fail with gateErr if
	// that is set then.
	gate    chan struct{}
	gateEnd int64
	gateErr error
}

// wait blocks a read that starts at off until its bytes are final.
func (s *Segments) wait(off int64) error {
	if s.gate == nil || off >= s.gateEnd {
		return nil
	}
	<-s.gate
	return s.gateErr
}

// NewSegments returns a reader over segs in order.
func NewSegments(segs ...[]byte) *Segments {
	s := &Segments{segs: segs, ends: make([]int64, len(segs))}
	var n int64
	for i, b := range segs {
		n += int64(len(b))
		s.ends[i] = n
	}
	return s
}

// Size returns the total length.
func (s *Segments) Size() int64 {
	if len(s.ends) == 0 {
		return 0
	}
	return s.ends[len(s.ends)-1]
}

// Read implements io.Reader.
func (s *Segments) Read(p []byte) (int, error) {
	n, err := s.ReadAt(p, s.off)
	s.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// ReadAt implements io.ReaderAt.
func (s *Segments) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("segments: negative offset")
	}
	if err := s.wait(off); err != nil {
		return 0, err
	}
	i := sort.Search(len(s.ends), func(i int) bool { return s.ends[i] > off })
	n := 0
	for ; i < len(s.segs) && n < len(p); i++ {
		start := s.ends[i] - int64(len(s.segs[i]))
		c := copy(p[n:], s.segs[i][off+int64(n)-start:])
		n += c
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Seek implements io.Seeker.
func (s *Segments) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += s.off
	case io.SeekEnd:
		offset += s.Size()
	default:
		return 0, errors.New("segments: bad whence")
	}
	if offset < 0 {
		return 0, errors.New("segments: negative position")
	}
	s.off = offset
	return offset, nil
}

// WriteTo implements io.WriterTo, so io.Copy hands each segment to the
// writer whole instead of through a 32 KiB bounce buffer.
func (s *Segments) WriteTo(w io.Writer) (int64, error) {
	var total int64
	if err := s.wait(s.off); err != nil {
		return 0, err
	}
	for s.off < s.Size() {
		i := sort.Search(len(s.ends), func(i int) bool { return s.ends[i] > s.off })
		start := s.ends[i] - int64(len(s.segs[i]))
		n, err := w.Write(s.segs[i][s.off-start:])
		s.off += int64(n)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

var _ interface {
	io.Reader
	io.ReaderAt
	io.Seeker
	io.WriterTo
} = (*Segments)(nil)
