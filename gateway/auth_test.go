package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTokens(t *testing.T) {
	dir := t.TempDir()
	a, _ := NewToken()
	b, _ := NewToken()
	if !strings.HasPrefix(a, TokenPrefix) || len(a) != len(TokenPrefix)+43 || a == b {
		t.Fatalf("tokens %q %q", a, b)
	}
	la, _ := TokenLine("alice", a)
	lb, _ := TokenLine("alice", b)
	f := filepath.Join(dir, "tokens")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		// A new modification time even on a coarse clock.
		future := time.Now().Add(time.Duration(len(s)) * time.Second)
		_ = os.Chtimes(f, future, future)
	}
	write("# rotation\n\n" + la + "\n" + lb + "\n")
	tk, err := LoadTokens(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{a, b} {
		if name, ok := tk.Lookup(tok); !ok || name != "alice" {
			t.Fatalf("token not found under its name: %q %v", name, ok)
		}
	}
	if _, ok := tk.Lookup(a + "x"); ok {
		t.Fatal("a token with a byte more was accepted")
	}
	if strings.Contains(la, a) {
		t.Fatal("the token file line holds the token")
	}
	// Rotation: the old line goes, the old token with it.
	write(lb + "\n")
	if changed, err := tk.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	if _, ok := tk.Lookup(a); ok {
		t.Fatal("a removed token still works")
	}
	// A bad file keeps the tokens in force and names the line, never its text.
	write(lb + "\n" + a + "\n")
	_, err = tk.Reload()
	if err == nil || !strings.Contains(err.Error(), "line 2") || strings.Contains(err.Error(), a) {
		t.Fatalf("bad line: %v", err)
	}
	if _, ok := tk.Lookup(b); !ok {
		t.Fatal("a failed reload dropped the tokens")
	}
	write("# nothing\n")
	if _, err := LoadTokens(f); err == nil || !strings.Contains(err.Error(), "hold no token") {
		t.Fatalf("empty file: %v", err)
	}
	if _, err := TokenLine("a b", a); err == nil {
		t.Fatal("a name with a space was taken")
	}
	for h, want := range map[string]string{"Bearer x": "x", "bearer  y ": "y", "Basic x": "", "Bearer": "", "Bearer  ": ""} {
		if got, _ := bearer(h); got != want {
			t.Errorf("bearer(%q) = %q, want %q", h, got, want)
		}
	}
}

func TestLimiters(t *testing.T) {
	l := newLimiters(1, 2)
	for i := range 2 {
		if ok, _ := l.allow("a"); !ok {
			t.Fatalf("request %d within the burst refused", i)
		}
	}
	ok, d := l.allow("a")
	if ok || d <= 0 || d > time.Second {
		t.Fatalf("third request: %v, retry after %v", ok, d)
	}
	if ok, _ := l.allow("b"); !ok {
		t.Fatal("another token shares a's bucket")
	}
	if ok, _ := newLimiters(0, 0).allow("a"); !ok {
		t.Fatal("rate 0 limits")
	}
	if retryAfter(1500*time.Millisecond) != 2 || retryAfter(time.Millisecond) != 1 {
		t.Fatal("retryAfter")
	}
}
