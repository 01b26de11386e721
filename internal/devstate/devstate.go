// Package devstate is how a dev-mode worker (worker --dev) and the enqueue
// CLI find each other without flags.
//
// The dev worker writes a small JSON file, dev.json, into its dev
// directory once it serves jobs, and removes it when it stops. The CLI,
// when no Redis address is configured anywhere (flag, environment, config
// file), reads that file from the same directory and takes the embedded
// Redis address and the file store root from it. Both programs resolve the
// directory the same way: --dev-dir, else RMSGRAD_DEV_DIR, else
// ./rmsgrad-dev. So `worker --dev` and `enqueue ...` run from one directory
// agree with no flag at all, and a dev worker started with another
// directory prints the --dev-dir the CLI needs.
//
// Why a file rather than one default address for both: the CLI's default
// must stay the production Redis (127.0.0.1:6379, where a fleet's Redis
// usually is), and the dev worker must not take a port where a real Redis
// may already run; a file also carries the file store root, which the CLI
// needs to pass local files as file:// URIs, and lets the dev worker use
// a port chosen at start (dev.redis_addr with port 0).
package devstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultDir is the dev directory when neither --dev-dir nor
// RMSGRAD_DEV_DIR names one, relative to the working directory.
const DefaultDir = "./rmsgrad-dev"

// EnvDir is the environment variable both programs read the dev directory
// from.
const EnvDir = "RMSGRAD_DEV_DIR"

// FileName is the state file's name inside the dev directory.
const FileName = "dev.json"

// State is what a running dev worker tells the CLI.
type State struct {
	RedisAddr string `json:"redis_addr"` // the embedded Redis-protocol server
	FileRoot  string `json:"file_root"`  // absolute: the file store's root (the dev directory)
	HTTPAddr  string `json:"http_addr,omitempty"`
	PID       int    `json:"pid"`
}

// Path is the state file of dir.
func Path(dir string) string { return filepath.Join(dir, FileName) }

// Dir resolves the dev directory: flag when set, else the variable, else
// DefaultDir.
func Dir(flag string, getenv func(string) string) string {
	if flag != "" {
		return flag
	}
	if v := getenv(EnvDir); v != "" {
		return v
	}
	return DefaultDir
}

// Write writes s into dir's state file atomically (a temporary file
// renamed over it), so that a reader sees the whole file or none.
func Write(dir string, s State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".dev.json-*")
	if err != nil {
		return fmt.Errorf("dev state: %w", err)
	}
	_, werr := tmp.Write(append(b, '\n'))
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("dev state: %w", err)
	}
	if err := os.Rename(tmp.Name(), Path(dir)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("dev state: %w", err)
	}
	return nil
}

// Read reads dir's state file. A directory without one gives an error
// matching os.ErrNotExist.
func Read(dir string) (State, error) {
	var s State
	b, err := os.ReadFile(Path(dir))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", Path(dir), err)
	}
	if s.RedisAddr == "" || s.FileRoot == "" {
		return s, fmt.Errorf("%s: redis_addr or file_root missing", Path(dir))
	}
	return s, nil
}

// Remove deletes dir's state file if it is still the one process pid
// wrote: a second dev worker on the same directory may have replaced it.
func Remove(dir string, pid int) error {
	s, err := Read(dir)
	if err != nil || s.PID != pid {
		return nil
	}
	if err := os.Remove(Path(dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
