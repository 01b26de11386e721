package s3

import (
	"errors"
	"net/url"
	"testing"

	"github.com/rmsgrad/rmsgrad/storage"
)

// A request cut by a dying server surfaces from minio-go as a url.Error
// whose cause is a plain "Connection closed by foreign host" error (it
// replaces the EOF): that is storage being unavailable, transient, not a
// job's permanent failure.
func TestClassifyClosedConnection(t *testing.T) {
	err := &url.Error{Op: "Put", URL: "http://127.0.0.1:1/b/k?partNumber=2",
		Err: errors.New("Connection closed by foreign host http://127.0.0.1:1/b/k?partNumber=2. Retry again.")}
	got := classify(err)
	if !errors.Is(got, storage.ErrUnavailable) || !retryable(got) {
		t.Fatalf("classify(%v) = %v: want transient storage.ErrUnavailable", err, got)
	}
	if got := classify(errors.New("some other failure")); errors.Is(got, storage.ErrUnavailable) {
		t.Fatalf("a plain error was classified as unavailable: %v", got)
	}
}
