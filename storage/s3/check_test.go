package s3_test

import (
	"context"
	"errors"
	"testing"

	"github.com/rmsgrad/rmsgrad/storage"
	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// TestCheckBucketNames: a listed bucket passes without the per-call name
// check (New checked it), and an unlisted one is still refused as an
// invalid URI when its name is not a bucket name, else as not allowed.
func TestCheckBucketNames(t *testing.T) {
	st, err := s3.New(context.Background(), s3.Config{Endpoint: "127.0.0.1:1", Region: "us-east-1",
		Allow: []s3.AllowRule{{Bucket: "data", Prefixes: []string{"t/"}}}})
	if err != nil {
		t.Fatal(err)
	}
	ref := func(b string) storage.Ref { return storage.Ref{Scheme: "s3", Bucket: b, Key: "t/x"} }
	if err := st.Check(ref("data"), true); err != nil {
		t.Errorf("listed bucket: %v", err)
	}
	for _, b := range []string{"a..b", "AB", "x", "-ab"} {
		if err := st.Check(ref(b), false); !errors.Is(err, storage.ErrInvalidURI) {
			t.Errorf("bucket %q: %v, want ErrInvalidURI", b, err)
		}
	}
	if err := st.Check(ref("other"), false); !errors.Is(err, storage.ErrNotAllowed) {
		t.Errorf("unlisted bucket: %v, want ErrNotAllowed", err)
	}
	if _, err := s3.New(context.Background(), s3.Config{Endpoint: "127.0.0.1:1", Allow: []s3.AllowRule{{Bucket: "A..b"}}}); err == nil {
		t.Error("New took an invalid bucket name in the allow-list")
	}
}
