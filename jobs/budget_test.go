package jobs

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBudget(t *testing.T) {
	b := NewBudget(100)
	ctx := context.Background()
	if err := b.Acquire(ctx, 101); !errors.Is(err, ErrNeverFits) {
		t.Fatalf("Acquire over capacity = %v, want ErrNeverFits", err)
	}
	if !IsPermanent(jobErr("j", "", "", b.Acquire(ctx, 101))) {
		t.Fatal("a job that can never fit must be permanent")
	}
	if err := b.Acquire(ctx, 60); err != nil {
		t.Fatal(err)
	}
	if b.InUse() != 60 {
		t.Fatalf("InUse = %d, want 60", b.InUse())
	}
	// 60 + 50 > 100: waits, and gives up when ctx ends.
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if err := b.Acquire(short, 50); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire beyond free = %v, want deadline exceeded", err)
	}
	if IsPermanent(jobErr("j", "", "", b.Acquire(short, 50))) {
		t.Fatal("waiting out a deadline is transient")
	}
	got := make(chan error, 1)
	go func() { got <- b.Acquire(ctx, 50) }()
	select {
	case err := <-got:
		t.Fatalf("Acquire returned %v before bytes were released", err)
	case <-time.After(20 * time.Millisecond):
	}
	b.Release(60)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Acquire did not wake after Release")
	}
	if b.InUse() != 50 {
		t.Fatalf("InUse = %d, want 50", b.InUse())
	}
	b.Release(50)
	if b.InUse() != 0 {
		t.Fatalf("InUse = %d after releasing all", b.InUse())
	}
}

func TestRetryDelay(t *testing.T) {
	f := RetryDelay(100*time.Millisecond, 2*time.Second)
	for n := 0; n < 50; n++ {
		d := f(n, nil, nil)
		want := min(100*time.Millisecond<<min(n, 30), 2*time.Second)
		if n >= 30 {
			want = 2 * time.Second
		}
		if d < want/2 || d > want {
			t.Fatalf("retry %d: delay %v outside [%v, %v]", n, d, want/2, want)
		}
	}
}
