package secret

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGet(t *testing.T) {
	f := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(f, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"X_SET": "from-env"}
	s := NewSource(func(k string) string { return env[k] })
	if v, err := s.Get("a", "X_SET", f, "a_file"); err != nil || v != "from-env" || s.From["a"] != "env X_SET" {
		t.Errorf("variable first: %q, %v, from %q", v, err, s.From["a"])
	}
	if v, err := s.Get("b", "X_UNSET", f, "b_file"); err != nil || v != "from-file" || s.From["b"] != "b_file "+f {
		t.Errorf("then the file: %q, %v, from %q", v, err, s.From["b"])
	}
	if v, err := s.Get("c", "X_UNSET", "", "c_file"); err != nil || v != "" || s.From["c"] != "" {
		t.Errorf("neither: %q, %v, from %q", v, err, s.From["c"])
	}
	if _, err := s.Get("d", "X_UNSET", f+".missing", "d_file"); err == nil || !strings.Contains(err.Error(), "d_file") || strings.Contains(err.Error(), "from-file") {
		t.Errorf("a missing file: %v, want an error naming d_file and no secret", err)
	}
}
