package storage

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"
)

func TestSegments(t *testing.T) {
	a, b, c := []byte("head"), []byte("0123456789"), []byte("xyz")
	s := NewSegments(a, nil, b, c)
	want := []byte("head0123456789xyz")
	if s.Size() != int64(len(want)) {
		t.Fatalf("Size = %d", s.Size())
	}
	for off := 0; off <= len(want); off++ {
		for n := 0; off+n <= len(want); n++ {
			p := make([]byte, n)
			if k, err := s.ReadAt(p, int64(off)); k != n || err != nil || !bytes.Equal(p, want[off:off+n]) {
				t.Fatalf("ReadAt(%d, %d) = %d, %v, %q", off, n, k, err, p)
			}
		}
	}
	if k, err := s.ReadAt(make([]byte, 5), int64(len(want)-2)); k != 2 || err != io.EOF {
		t.Errorf("ReadAt past the end = %d, %v", k, err)
	}
	got, err := io.ReadAll(s)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("ReadAll = %q, %v", got, err)
	}
	_, _ = s.Seek(3, io.SeekStart)
	var w bytes.Buffer
	if n, err := s.WriteTo(&w); n != int64(len(want)-3) || err != nil || !bytes.Equal(w.Bytes(), want[3:]) {
		t.Errorf("WriteTo after Seek(3) = %d, %v, %q", n, err, w.Bytes())
	}
}

// TestSegmentsGate: reads of the gated header wait for the gate and fail
// with its error; reads past it do not wait.
func TestSegmentsGate(t *testing.T) {
	hdr := []byte("????")
	s := NewSegments(hdr, []byte("data"))
	s.gate, s.gateEnd = make(chan struct{}), 4
	p := make([]byte, 4)
	if _, err := s.ReadAt(p, 4); err != nil || string(p) != "data" {
		t.Fatalf("read past the gate: %q, %v", p, err)
	}
	done := make(chan string)
	go func() {
		q := make([]byte, 8)
		_, err := s.ReadAt(q, 0)
		done <- string(q) + errString(err)
	}()
	select {
	case got := <-done:
		t.Fatalf("read of the gated header returned %q before the gate opened", got)
	case <-time.After(50 * time.Millisecond):
	}
	copy(hdr, "HEAD")
	close(s.gate)
	if got := <-done; got != "HEADdata" {
		t.Errorf("gated read = %q", got)
	}
	s = NewSegments([]byte("????"), []byte("data"))
	s.gate, s.gateEnd, s.gateErr = make(chan struct{}), 4, errors.New("hash failed")
	close(s.gate)
	if _, err := s.ReadAt(p, 0); err == nil {
		t.Error("a read of a header that failed succeeded")
	}
	if _, err := s.WriteTo(io.Discard); err == nil {
		t.Error("WriteTo of a header that failed succeeded")
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return " " + err.Error()
}
