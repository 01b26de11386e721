package devstate

import (
	"errors"
	"os"
	"testing"
)

func TestWriteReadRemove(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Read of a directory without a state file: %v, want ErrNotExist", err)
	}
	s := State{RedisAddr: "127.0.0.1:40001", FileRoot: dir, HTTPAddr: "127.0.0.1:40002", PID: 42}
	if err := Write(dir, s); err != nil {
		t.Fatal(err)
	}
	got, err := Read(dir)
	if err != nil || got != s {
		t.Fatalf("Read = %+v, %v; want %+v", got, err, s)
	}
	// Another process's file stays.
	if err := Remove(dir, 43); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); err != nil {
		t.Fatalf("Remove by another pid deleted the file: %v", err)
	}
	if err := Remove(dir, 42); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Remove: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
}

func TestReadRejectsIncomplete(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(Path(dir), []byte(`{"redis_addr": ""}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); err == nil {
		t.Fatal("a state file without an address was accepted")
	}
}

func TestDir(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if d := Dir("", env(nil)); d != DefaultDir {
		t.Errorf("default %q", d)
	}
	if d := Dir("", env(map[string]string{EnvDir: "/e"})); d != "/e" {
		t.Errorf("env %q", d)
	}
	if d := Dir("/f", env(map[string]string{EnvDir: "/e"})); d != "/f" {
		t.Errorf("flag %q", d)
	}
}
