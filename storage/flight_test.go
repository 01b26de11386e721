package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rmsgrad/rmsgrad/storage/safetensors"
)

// gatedStore is an in-memory Store whose ReadPrefix calls are counted per
// object and, while gate is set, block until it is closed (or their context
// ends), so a test can hold a read in flight.
type gatedStore struct {
	mu      sync.Mutex
	objs    map[string][]byte
	etags   map[string]string
	prefix  map[string]int // ReadPrefix calls per key
	gate    chan struct{}
	entered chan string // one send per ReadPrefix that reached the gate
	fail    map[string]error
}

func newGatedStore() *gatedStore {
	return &gatedStore{objs: map[string][]byte{}, etags: map[string]string{}, prefix: map[string]int{},
		entered: make(chan string, 64), fail: map[string]error{}}
}

func (g *gatedStore) Check(Ref, bool) error { return nil }

func (g *gatedStore) Stat(_ context.Context, ref Ref) (ObjectInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.objs[ref.Key]
	if !ok {
		return ObjectInfo{}, ErrNotFound
	}
	return ObjectInfo{Size: int64(len(b)), ETag: g.etags[ref.Key]}, nil
}

func (g *gatedStore) ReadAt(_ context.Context, ref Ref, etag string, p []byte, off int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.objs[ref.Key]
	if !ok {
		return ErrNotFound
	}
	if etag != "" && etag != g.etags[ref.Key] {
		return ErrChanged
	}
	if off+int64(len(p)) > int64(len(b)) {
		return ErrShortRead
	}
	copy(p, b[off:])
	return nil
}

func (g *gatedStore) ReadPrefix(ctx context.Context, ref Ref, p []byte) (int, ObjectInfo, error) {
	g.mu.Lock()
	g.prefix[ref.Key]++
	gate, fail := g.gate, g.fail[ref.Key]
	g.mu.Unlock()
	if gate != nil {
		g.entered <- ref.Key
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, ObjectInfo{}, ctx.Err()
		}
	}
	if fail != nil {
		return 0, ObjectInfo{}, fail
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.objs[ref.Key]
	if !ok {
		return 0, ObjectInfo{}, ErrNotFound
	}
	return copy(p, b), ObjectInfo{Size: int64(len(b)), ETag: g.etags[ref.Key]}, nil
}

func (g *gatedStore) Put(_ context.Context, ref Ref, r io.Reader, size int64) error {
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.objs[ref.Key] = b
	g.etags[ref.Key] = fmt.Sprintf("%q", fmt.Sprint(len(g.etags)+1))
	return nil
}

func (g *gatedStore) reads(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.prefix[key]
}

func (g *gatedStore) setGate(c chan struct{}) {
	g.mu.Lock()
	g.gate = c
	g.mu.Unlock()
}

// sharedFixture: a Router over a gatedStore holding w (4 KiB, as a layer's
// weight) and another object.
func sharedFixture(t *testing.T, opts ...Option) (*Router, *gatedStore, []byte) {
	t.Helper()
	g := newGatedStore()
	r := NewRouter(opts...)
	r.Register("s3", g)
	w := make([]float32, 1024)
	for i := range w {
		w[i] = float32(i)*0.5 - 3
	}
	ctx := context.Background()
	for _, uri := range []string{"s3://b/w.safetensors", "s3://b/other.safetensors"} {
		if _, err := r.Write(ctx, uri, []OutTensor{safetensors.F32("w", []int{1024}, w)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	want := make([]byte, 4096)
	for i, v := range w {
		binary.LittleEndian.PutUint32(want[4*i:], math.Float32bits(v))
	}
	return r, g, want
}

// startHeads starts n Heads of uri and returns their results' channel.
func startHeads(ctx context.Context, r *Router, uri string, n int) chan headResult {
	out := make(chan headResult, n)
	for range n {
		go func() {
			info, err := r.Head(ctx, uri)
			out <- headResult{info, err}
		}()
	}
	return out
}

type headResult struct {
	info TensorInfo
	err  error
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSharedReads: Heads of one object that overlap a read in flight share
// it (one request), each gets its own copy of the bytes to take or fetch,
// and a Head of another object is not held up or shared.
func TestSharedReads(t *testing.T) {
	ctx := context.Background()
	r, g, want := sharedFixture(t)
	const key, uri = "w.safetensors", "s3://b/w.safetensors"
	gate := make(chan struct{})
	g.setGate(gate)
	first := startHeads(ctx, r, uri, 1)
	if k := <-g.entered; k != key {
		t.Fatalf("first read of %s", k)
	}
	followers := startHeads(ctx, r, uri+"#w", 3)
	waitFor(t, "3 Heads waiting on the read in flight", func() bool { return r.flights.waiting("s3://b/w.safetensors") == 3 })

	// Another object reads on its own (the gate holds it too, so let it go
	// after checking it entered its own read).
	other := startHeads(ctx, r, "s3://b/other.safetensors", 1)
	if k := <-g.entered; k != "other.safetensors" {
		t.Fatalf("read of %s, want other.safetensors", k)
	}
	g.setGate(nil)
	close(gate)

	var infos []TensorInfo
	for _, c := range []chan headResult{first, followers, followers, followers, other} {
		res := <-c
		if res.err != nil {
			t.Fatal(res.err)
		}
		infos = append(infos, res.info)
	}
	if n := g.reads(key); n != 1 {
		t.Errorf("%d reads of w for 4 overlapping Heads, want 1", n)
	}
	if n := g.reads("other.safetensors"); n != 1 {
		t.Errorf("%d reads of the other object, want 1", n)
	}
	if n := r.SharedReads(); n != 3 {
		t.Errorf("SharedReads = %d, want 3", n)
	}
	// Each Head's bytes are its own: taking and scribbling on one leaves
	// the others intact, and each releases its own buffer.
	var held [][]byte
	var releases []func()
	for i, info := range infos[:4] {
		if info.ETag == "" || info.ETag != infos[0].ETag || info.Size != 4096 || info.Offset != infos[0].Offset {
			t.Fatalf("Head %d: %+v, want the first Head's version and location", i, info)
		}
		data, release, ok := info.TakeInline()
		if !ok || !bytes.Equal(data, want) {
			t.Fatalf("Head %d: TakeInline ok %v, bytes equal %v", i, ok, bytes.Equal(data, want))
		}
		held = append(held, data)
		releases = append(releases, release)
	}
	for i := range held[1] { // a waiting Head's copy
		held[1][i] = 0xff
	}
	for i, data := range held {
		if i != 1 && !bytes.Equal(data, want) {
			t.Fatalf("Head %d's bytes changed with another Head's", i)
		}
	}
	for _, rel := range releases {
		rel()
	}
	// After the flight, a new Head reads again.
	if _, err := r.Head(ctx, uri); err != nil {
		t.Fatal(err)
	}
	if n := g.reads(key); n != 2 {
		t.Errorf("%d reads of w after a later Head, want 2", n)
	}
}

// TestSharedReadFailure: when the read in flight fails (its Head's context
// ends), the Heads waiting on it read the object themselves and succeed; a
// waiting Head whose own context ends returns at once with its own error.
func TestSharedReadFailure(t *testing.T) {
	r, g, want := sharedFixture(t)
	const key, uri = "w.safetensors", "s3://b/w.safetensors"
	gate := make(chan struct{})
	g.setGate(gate)
	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	leader := startHeads(leaderCtx, r, uri, 1)
	<-g.entered
	followers := startHeads(context.Background(), r, uri, 2)
	quitterCtx, quit := context.WithCancelCause(context.Background())
	quitter := startHeads(quitterCtx, r, uri, 1)
	waitFor(t, "3 Heads waiting", func() bool { return r.flights.waiting(uri) == 3 })

	cause := errors.New("job cancelled")
	quit(cause)
	if res := <-quitter; !errors.Is(res.err, cause) {
		t.Fatalf("waiting Head whose context ended: %v, want its cause", res.err)
	}
	g.setGate(nil) // the followers' own reads go through
	cancelLeader()
	if res := <-leader; !errors.Is(res.err, context.Canceled) {
		t.Fatalf("leader: %v, want context.Canceled", res.err)
	}
	for range 2 {
		res := <-followers
		if res.err != nil {
			t.Fatalf("follower after the leader failed: %v", res.err)
		}
		got := make([]byte, res.info.Size)
		if err := r.Fetch(context.Background(), res.info, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("follower's Fetch: %v, equal %v", err, bytes.Equal(got, want))
		}
	}
	if n := g.reads(key); n != 3 {
		t.Errorf("%d reads: want the leader's and one per follower, 3", n)
	}
	if n := r.SharedReads(); n != 0 {
		t.Errorf("SharedReads = %d after a failed read, want 0", n)
	}
	close(gate)
}

// TestSharedReadsOff: WithSharedReads(false) reads once per Head.
func TestSharedReadsOff(t *testing.T) {
	r, g, _ := sharedFixture(t, WithSharedReads(false))
	gate := make(chan struct{})
	g.setGate(gate)
	res := startHeads(context.Background(), r, "s3://b/w.safetensors", 3)
	for range 3 {
		<-g.entered // all three reach the store while none has finished
	}
	close(gate)
	for range 3 {
		if r := <-res; r.err != nil {
			t.Fatal(r.err)
		}
	}
	if n := g.reads("w.safetensors"); n != 3 || r.SharedReads() != 0 {
		t.Errorf("reads %d, shared %d; want 3 and 0", n, r.SharedReads())
	}
}

// TestSharedReadsRace hammers one object from many goroutines (run with
// -race): every Head succeeds with the right bytes, and reads + shared
// Heads account for every Head.
func TestSharedReadsRace(t *testing.T) {
	r, g, want := sharedFixture(t)
	const n = 400
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			info, err := r.Head(context.Background(), "s3://b/w.safetensors")
			if err != nil {
				bad.Add(1)
				return
			}
			got := make([]byte, info.Size)
			if err := r.Fetch(context.Background(), info, got); err != nil || !bytes.Equal(got, want) {
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d of %d Heads failed or read wrong bytes", bad.Load(), n)
	}
	if reads, shared := g.reads("w.safetensors"), r.SharedReads(); int64(reads)+shared != n {
		t.Errorf("reads %d + shared %d != %d Heads", reads, shared, n)
	}
}
