package main

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// yamlKeys lists the dotted YAML keys of a config struct, depth first;
// slices and maps are leaves.
func yamlKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		key := prefix + tag
		if f.Type.Kind() == reflect.Struct && f.Type.String() != "time.Duration" {
			keys = append(keys, yamlKeys(f.Type, key+".")...)
			continue
		}
		keys = append(keys, key)
	}
	return keys
}

// TestConfigReferenceIsComplete: docs/configuration.md names every key of
// the worker's configuration, and every environment variable it reads.
func TestConfigReferenceIsComplete(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	keys := yamlKeys(reflect.TypeOf(Config{}), "")
	if len(keys) < 40 {
		t.Fatalf("found only %d keys: %v", len(keys), keys)
	}
	for _, k := range keys {
		if !strings.Contains(doc, "`"+k+"`") {
			t.Errorf("docs/configuration.md does not name the worker key `%s`", k)
		}
	}
	for _, e := range envVars {
		if !strings.Contains(doc, "`"+e.env+"`") {
			t.Errorf("docs/configuration.md does not name %s (%s)", e.env, e.key)
		}
	}
	for _, v := range []string{"RMSGRAD_CONFIG", "RMSGRAD_REDIS_PASSWORD", "RMSGRAD_S3_ACCESS_KEY", "RMSGRAD_S3_SECRET_KEY", "RMSGRAD_SIGNING_KEY"} {
		if !strings.Contains(doc, "`"+v+"`") {
			t.Errorf("docs/configuration.md does not name %s", v)
		}
	}
}
