package s3

import (
	"errors"
	"net/url"
	"testing"

	"github.com/minio/minio-go/v7"

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

// The status codes of an S3 answer: the server's state (5xx, 429, SlowDown)
// is an outage to wait out; an answer about the request itself (4xx, 501
// NotImplemented, 505) is permanent, or the job would be retried for ever
// as an uncounted outage while the store otherwise answers.
func TestClassifyStatus(t *testing.T) {
	for _, c := range []struct {
		status      int
		code        string
		unavailable bool
		rejected    bool
	}{
		{500, "InternalError", true, false},
		{502, "", true, false},
		{503, "SlowDown", true, false},
		{504, "", true, false},
		{429, "", true, false},
		{400, "InvalidArgument", false, true},
		{501, "NotImplemented", false, true},
		{505, "", false, true},
	} {
		got := classify(minio.ErrorResponse{StatusCode: c.status, Code: c.code, Message: "m"})
		if errors.Is(got, storage.ErrUnavailable) != c.unavailable || errors.Is(got, storage.ErrRejected) != c.rejected {
			t.Errorf("HTTP %d %s: %v, want unavailable %v, rejected %v", c.status, c.code, got, c.unavailable, c.rejected)
		}
		if c.rejected && !storage.Permanent(got) {
			t.Errorf("HTTP %d %s: %v is not permanent", c.status, c.code, got)
		}
	}
}
