// Package secret reads the secrets of rmsgrad's programs (the Redis
// password, S3 keys, signing keys): each from its environment variable,
// else from the file a config key names, never from the config file itself.
// It records where each came from, for --print-config, never the value.
package secret

import (
	"fmt"
	"os"
	"strings"
)

// Source reads secrets through getenv and records their origins.
type Source struct {
	getenv func(string) string
	// From maps a secret's name to where it came from ("env VAR" or
	// "key path"); a secret not set has no entry.
	From map[string]string
}

// NewSource returns a Source reading variables through getenv.
func NewSource(getenv func(string) string) *Source {
	return &Source{getenv: getenv, From: map[string]string{}}
}

// Get returns the secret name: the value of the variable env when set,
// else the contents of file (trailing newlines dropped) when file is not
// "", else "". An unreadable file is an error naming fileKey, the config
// key that named it.
func (s *Source) Get(name, env, file, fileKey string) (string, error) {
	if v := s.getenv(env); v != "" {
		s.From[name] = "env " + env
		return v, nil
	}
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("config: %s: %w", fileKey, err)
	}
	s.From[name] = fileKey + " " + file
	return strings.TrimRight(string(b), "\r\n"), nil
}
