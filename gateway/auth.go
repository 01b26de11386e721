package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"
)

// TokenPrefix starts every token NewToken makes, so that a leaked one is
// easy to recognise (and to search for in logs and repositories).
const TokenPrefix = "rmsgrad_"

// Tokens are the bearer tokens a gateway accepts, read from token files
// that hold only their SHA-256 hashes: one "<name> sha256:<64 hex>" line
// per token, # comments and blank lines ignored. Several lines may share a
// name: that is how a key is rotated (add the new line, move the clients,
// delete the old line). The name is what logs, metrics and rate limits
// see; the token itself is never logged or stored.
//
// Hashing is enough because tokens are 256 random bits (NewToken): a slow
// password hash protects guessable secrets, not these.
type Tokens struct {
	files []string
	mu    sync.RWMutex
	names map[[sha256.Size]byte]string
	stamp string // the files' sizes and modification times when read
}

var (
	tokenLine = regexp.MustCompile(`^([A-Za-z0-9._@-]{1,64})\s+sha256:([0-9a-f]{64})$`)
	tokenName = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)
)

// LoadTokens reads the token files. A file that is missing or holds a
// malformed line is an error naming the file and line (never its text,
// which might be a token pasted by mistake). No token at all is an error.
func LoadTokens(files ...string) (*Tokens, error) {
	t := &Tokens{files: files}
	if _, err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Count returns how many tokens are loaded.
func (t *Tokens) Count() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.names)
}

// Lookup returns the name of token, or false. The comparison is of
// SHA-256 hashes in a map: what its timing could reveal is a hash prefix,
// which says nothing about a token.
func (t *Tokens) Lookup(token string) (string, bool) {
	h := sha256.Sum256([]byte(token))
	t.mu.RLock()
	defer t.mu.RUnlock()
	name, ok := t.names[h]
	return name, ok
}

// Reload reads the files again when one of them changed (size or
// modification time) and reports whether it did. On an error the tokens
// loaded before stay in force.
func (t *Tokens) Reload() (bool, error) {
	var stamp strings.Builder
	for _, f := range t.files {
		fi, err := os.Stat(f)
		if err != nil {
			return false, fmt.Errorf("auth: token file: %w", err)
		}
		fmt.Fprintf(&stamp, "%s:%d:%d;", f, fi.Size(), fi.ModTime().UnixNano())
	}
	t.mu.RLock()
	same := stamp.String() == t.stamp
	t.mu.RUnlock()
	if same {
		return false, nil
	}
	names := map[[sha256.Size]byte]string{}
	for _, f := range t.files {
		b, err := os.ReadFile(f)
		if err != nil {
			return false, fmt.Errorf("auth: token file: %w", err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			m := tokenLine.FindStringSubmatch(line)
			if m == nil {
				return false, fmt.Errorf("auth: token file %s line %d: want \"<name> sha256:<64 lowercase hex digits>\" (make lines with `gateway token`)", f, n)
			}
			var h [sha256.Size]byte
			_, _ = hex.Decode(h[:], []byte(m[2]))
			names[h] = m[1]
		}
		if err := sc.Err(); err != nil {
			return false, fmt.Errorf("auth: token file %s: %w", f, err)
		}
	}
	if len(names) == 0 {
		return false, fmt.Errorf("auth: the token files (%s) hold no token", strings.Join(t.files, ", "))
	}
	t.mu.Lock()
	t.names, t.stamp = names, stamp.String()
	t.mu.Unlock()
	return true, nil
}

// Watch reloads the files every interval until ctx ends, logging each
// reload and each failed one.
func (t *Tokens) Watch(ctx context.Context, interval time.Duration, log *slog.Logger) {
	tk := time.NewTicker(interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		changed, err := t.Reload()
		switch {
		case err != nil:
			log.Error("token files not reloaded; the tokens loaded before stay in force", "err", err)
		case changed:
			log.Info("token files reloaded", "tokens", t.Count())
		}
	}
}

// NewToken returns a new random token (256 bits, base64url, with
// TokenPrefix).
func NewToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// TokenLine returns the token-file line for token under name.
func TokenLine(name, token string) (string, error) {
	if !tokenName.MatchString(name) {
		return "", errors.New("token name: want 1-64 of A-Z a-z 0-9 . _ @ -")
	}
	h := sha256.Sum256([]byte(token))
	return name + " sha256:" + hex.EncodeToString(h[:]), nil
}

// bearer returns the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}
