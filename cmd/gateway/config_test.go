package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rmsgrad/rmsgrad/gateway"
	"github.com/rmsgrad/rmsgrad/internal/cliflag"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConfigShippedFileIsValid(t *testing.T) {
	// The shipped file names no token file: with auth.disabled it must load
	// and equal the defaults it documents.
	b, err := os.ReadFile("../../configs/gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := writeFile(t, filepath.Join(t.TempDir(), "g.yaml"), strings.Replace(string(b), "disabled: false", "disabled: true", 1))
	cfg, _, err := loadConfig([]string{"--config", p}, env(nil), io.Discard, io.Discard)
	if err != nil {
		t.Fatalf("configs/gateway.yaml: %v", err)
	}
	def := defaultConfig()
	if cfg.Limits != def.Limits || cfg.Uploads != def.Uploads || fmt.Sprintf("%+v", cfg.Redis) != fmt.Sprintf("%+v", def.Redis) || cfg.HTTPAddr != def.HTTPAddr ||
		cfg.Timeout != def.Timeout || cfg.Retention != def.Retention || cfg.Auth.ReloadInterval != def.Auth.ReloadInterval || cfg.Dev != def.Dev {
		t.Fatalf("configs/gateway.yaml disagrees with the defaults it documents:\n%+v\n%+v", cfg, def)
	}
}

func TestConfigInvalidNamesTheKey(t *testing.T) {
	dir := t.TempDir()
	tok := writeFile(t, filepath.Join(dir, "tokens"), "")
	cases := []struct{ yaml, key string }{
		{"limits:\n  max_batchez: 3\n", "max_batchez"},
		{"log_level: loud\n", "log_level"},
		{"http_addr: 0.0.0.0:8080\nauth:\n  disabled: true\n", "auth.disabled"},
		{"auth:\n  token_files: []\n", "auth.token_files"},
		{"auth:\n  token_files: [" + tok + "]\nuploads:\n  expiry: 0s\n", "uploads.expiry"},
		{"auth:\n  token_files: [" + tok + "]\nuploads:\n  prefix: s3://b/p\n", "uploads.prefix"},
		{"auth:\n  token_files: [" + tok + "]\ntls:\n  cert_file: c\n", "tls.cert_file"},
		{"auth:\n  token_files: [" + tok + "]\nlimits:\n  requests_per_s: 5\n  burst: 0\n", "limits.requests_per_s"},
		{"auth:\n  token_files: [" + tok + "]\nredis:\n  password: hunter2\n", "password"},
	}
	for _, c := range cases {
		_, _, err := loadConfig([]string{"--config", writeFile(t, filepath.Join(dir, "g.yaml"), c.yaml)}, env(nil), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("config %q: error %v does not name %q", c.yaml, err, c.key)
		}
	}
}

func TestConfigDevAndSecrets(t *testing.T) {
	dir := t.TempDir()
	cfg, _, err := loadConfig([]string{"--dev", "--dev-dir", dir, "--dev-redis", "127.0.0.1:7777"}, env(nil), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Auth.Disabled || cfg.Redis.Addr != "127.0.0.1:7777" || cfg.Storage.FileRoot != dir || cfg.Uploads.Prefix != "file://"+dir+"/uploads/" {
		t.Fatalf("dev: %+v", cfg)
	}
	var out bytes.Buffer
	cfg, _, err = loadConfig([]string{"--dev", "--dev-dir", dir, "--print-config"},
		env(map[string]string{"RMSGRAD_SIGNING_KEY": "s3cr3t-key", "RMSGRAD_S3_SECRET_KEY": "also-secret"}), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := printConfig(&out, cfg); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "s3cr3t") || strings.Contains(out.String(), "also-secret") ||
		!strings.Contains(out.String(), "signing key: <redacted> from env RMSGRAD_SIGNING_KEY") {
		t.Fatalf("print-config:\n%s", out.String())
	}
}

func TestTokenCommand(t *testing.T) {
	f := filepath.Join(t.TempDir(), "tokens")
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"token", "--name", "ci", "--append", f}, env(nil), &out, &errb); err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(out.String())
	b, _ := os.ReadFile(f)
	if strings.Contains(string(b), tok) {
		t.Fatal("the token file holds the token itself")
	}
	tk, err := gateway.LoadTokens(f)
	if err != nil {
		t.Fatal(err)
	}
	if name, ok := tk.Lookup(tok); !ok || name != "ci" {
		t.Fatalf("the printed token is not the one appended: %q %v", name, ok)
	}
	if fi, _ := os.Stat(f); fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v, want 0600", fi.Mode().Perm())
	}
	if err := run(context.Background(), []string{"token"}, env(nil), &out, &errb); err == nil {
		t.Fatal("token without --name")
	}
}

// TestCommandLine: the gateway follows internal/cliflag: --help prints the
// usage on stdout and exits 0, bad usage exits 2 with the usage on stderr.
func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		out  string // in stdout (code 0) or stderr (code 2)
	}{
		{[]string{"-h"}, 0, "usage: gateway [flags]"},
		{[]string{"--help"}, 0, "-print-config"},
		{[]string{"token", "--help"}, 0, "usage: gateway token"},
		{[]string{"--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"extra"}, 2, ""},
		{[]string{"token"}, 2, ""},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), c.args, env(nil), &stdout, &stderr)
		if got := cliflag.ExitCode(err); got != c.code {
			t.Errorf("gateway %v: exit %d (%v), want %d", c.args, got, err, c.code)
		}
		out := stdout.String()
		if c.code != 0 {
			out = stderr.String()
		}
		if !strings.Contains(out, c.out) {
			t.Errorf("gateway %v: output lacks %q:\n%s", c.args, c.out, out)
		}
	}
}
