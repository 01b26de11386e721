package jobs

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rmsgrad/rmsgrad/compute"
)

// adoptBackend is refBackend plus compute.HostAdopter; refuse makes Adopt
// decline (as for unaligned memory), so the handler copies instead.
type adoptBackend struct {
	*refBackend
	refuse  bool
	adopted atomic.Int64
}

type adoptBuf struct {
	refBuf
	release func()
	done    atomic.Bool
}

func (b *adoptBuf) Release() {
	if b.done.CompareAndSwap(false, true) {
		b.release()
	}
}

func (a *adoptBackend) Adopt(dt compute.DType, shape []int, b []byte, release func()) (compute.Buffer, bool) {
	n := compute.NumElements(shape)
	if a.refuse || len(b) != dt.Size()*n || uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil, false
	}
	a.adopted.Add(1)
	return &adoptBuf{refBuf: refBuf{dt: dt, shape: slices.Clone(shape), n: n, raw: b}, release: release}, true
}

// takingStore is memStore whose tensors are all "held by the header
// read" (Local) and handed over by TakeInline, except the URIs in keep,
// which TakeInline declines (Fetch reads them). It counts releases and
// poisons a tensor's handed-over bytes once they are released, so a use
// after release shows in the outputs.
type takingStore struct {
	*memStore
	keep     map[string]bool
	taken    atomic.Int64
	released atomic.Int64
}

func (s *takingStore) Head(ctx context.Context, uri string) (TensorInfo, error) {
	t, err := s.memStore.Head(ctx, uri)
	t.Local = err == nil
	return t, err
}

func (s *takingStore) TakeInline(t TensorInfo) ([]byte, func(), bool) {
	if s.keep[t.URI] {
		return nil, nil, false
	}
	s.mu.Lock()
	data := slices.Clone(s.tensors[t.URI].data)
	s.mu.Unlock()
	s.taken.Add(1)
	var once atomic.Bool
	return data, func() {
		if !once.CompareAndSwap(false, true) {
			panic("release called twice")
		}
		for i := range data {
			data[i] = 0xff // NaN bytes: a later read would show
		}
		s.released.Add(1)
	}, true
}

// TestHandlerAdoptsInlineInputs: with a backend that adopts host memory
// and a store that hands over held bytes, inputs become buffers without a
// copy; outputs are bitwise those of the plain path, every handed-over
// buffer is released exactly once after the job, and an input the store
// keeps or the backend refuses is read or copied as before.
func TestHandlerAdoptsInlineInputs(t *testing.T) {
	plain := newHandlerEnv(t, Limits{}, 1<<30, nil)
	cases := []struct {
		name        string
		refuse      bool
		keep        []string
		wantAdopted int64
	}{
		{"all adopted", false, nil, 3},
		{"w read by Fetch", false, []string{"/w"}, 2},
		{"backend refuses: copied", true, nil, 0},
	}
	for k, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			be := &adoptBackend{refBackend: &refBackend{}, refuse: c.refuse}
			st := &takingStore{memStore: newMemStore("mem://ok/"), keep: map[string]bool{}}
			prefix := "mem://ok/adopt" + string(rune('a'+k))
			for _, u := range c.keep {
				st.keep[prefix+u] = true
			}
			b := NewBatcher(be, BatchConfig{MaxJobs: 8, MaxWait: time.Millisecond}, nil, nil)
			t.Cleanup(func() { b.Close(context.Background()) })
			h, err := NewHandler(HandlerConfig{Backend: be, Batcher: b, Store: st, Budget: NewBudget(1 << 30), Worker: "test"})
			if err != nil {
				t.Fatal(err)
			}
			if h.adopter == nil || h.taker == nil {
				t.Fatal("handler did not pick up the adopting backend and the taking store")
			}
			putInputs(st.memStore, prefix, 7, []int{4, 96})
			putInputs(plain.store, prefix, 7, []int{4, 96})
			j := testJob(prefix)
			j.Outputs = []string{"r", "dx", "dw"}
			if _, err := h.process(context.Background(), "id", payload(t, j), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := plain.h.process(context.Background(), "id", payload(t, j), nil); err != nil {
				t.Fatal(err)
			}
			for _, name := range j.Outputs {
				got, want := st.output(j.Out, name), plain.store.output(j.Out, name)
				if len(got) == 0 || !slices.Equal(bitsOf(got), bitsOf(want)) {
					t.Fatalf("output %s differs from the plain path's", name)
				}
			}
			if n := be.adopted.Load(); n != c.wantAdopted {
				t.Fatalf("%d inputs adopted, want %d", n, c.wantAdopted)
			}
			if taken, rel := st.taken.Load(), st.released.Load(); taken != 3-int64(len(c.keep)) || rel != taken {
				t.Fatalf("%d inputs handed over, %d released", taken, rel)
			}
		})
	}
}

func bitsOf(v []float32) []uint32 {
	b := make([]uint32, len(v))
	for i, f := range v {
		b[i] = *(*uint32)(unsafe.Pointer(&f))
	}
	return b
}
