package main

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// yamlKeys lists the dotted YAML keys of a config struct; slices are
// leaves.
func yamlKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		if f.Type.Kind() == reflect.Struct && f.Type.String() != "time.Duration" {
			keys = append(keys, yamlKeys(f.Type, prefix+tag+".")...)
			continue
		}
		keys = append(keys, prefix+tag)
	}
	return keys
}

// TestConfigReferenceIsComplete: the Enqueue CLI section of
// docs/configuration.md names every key of the CLI's configuration, and
// every variable the CLI reads.
func TestConfigReferenceIsComplete(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Enqueue CLI")
	if !ok {
		t.Fatal("docs/configuration.md has no Enqueue CLI section")
	}
	keys := yamlKeys(reflect.TypeOf(config{}), "")
	if len(keys) < 15 {
		t.Fatalf("found only %d keys: %v", len(keys), keys)
	}
	for _, k := range keys {
		if !strings.Contains(section, "`"+k+"`") {
			t.Errorf("docs/configuration.md, Enqueue CLI, does not name the key `%s`", k)
		}
	}
	for _, v := range []string{"RMSGRAD_ENQUEUE_CONFIG", "RMSGRAD_REDIS_ADDR", "RMSGRAD_REDIS_USERNAME", "RMSGRAD_REDIS_PASSWORD",
		"RMSGRAD_QUEUE", "RMSGRAD_FILE_ROOT", "RMSGRAD_UPLOAD_PREFIX", "RMSGRAD_S3_ENDPOINT", "RMSGRAD_SIGNING_KEY", "RMSGRAD_DEV_DIR"} {
		if !strings.Contains(string(b), "`"+v+"`") {
			t.Errorf("docs/configuration.md does not name %s", v)
		}
	}
}
