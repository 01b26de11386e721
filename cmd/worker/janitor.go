package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/rmsgrad/rmsgrad/storage/s3"
)

// uploadJanitor aborts the multipart uploads that a worker killed
// mid-upload left under the S3 allow-list's writable prefixes, once they
// are older than age: at start, then every age/2 (at most every 30
// minutes). A job recovered after such a kill removes its own debris when
// its output is written again (storage/s3, uploads.go); this catches the
// rest.
func uploadJanitor(ctx context.Context, st *s3.Store, age time.Duration, log *slog.Logger) {
	every := min(age/2, 30*time.Minute)
	for {
		res, err := st.AbortStaleUploads(ctx, age)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil:
			log.Warn("stale multipart uploads: cleanup incomplete", "aborted", res.Aborted, "bytes", res.Bytes, "err", err)
		case res.Aborted > 0:
			log.Info("stale multipart uploads aborted", "aborted", res.Aborted, "bytes", res.Bytes, "older_than", age.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
