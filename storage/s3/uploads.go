package s3

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/rmsgrad/rmsgrad/storage"
)

// A multipart upload that its sender never completed or aborted (the
// worker was killed mid-upload) keeps its parts on the server, unseen by
// readers but stored and, on AWS, billed. Two things remove them:
//
//   - After a multipart upload of a key completes, the store aborts the
//     other uploads of that same key that began before it: a job killed
//     mid-upload comes back through asynq's recoverer and writes the same
//     output key again, so its debris is gone once it is recovered. This
//     needs only a listing of one key, which every S3 server answers
//     (MinIO lists a bucket's uploads only by exact key).
//   - AbortStaleUploads, which the worker runs at start and periodically,
//     aborts uploads older than a safe age under the allow-list's writable
//     prefixes: debris whose job never ran again. It needs a listing by
//     prefix: AWS, versitygw, Ceph RGW and SeaweedFS have one; MinIO
//     answers it with nothing and cleans stale uploads itself
//     (MINIO_API_STALE_UPLOADS_EXPIRY, 24 h by default).

// keyUploads lists the multipart uploads in progress of exactly key.
func (s *Store) keyUploads(ctx context.Context, bucket, key string) ([]minio.ObjectMultipartInfo, error) {
	var out []minio.ObjectMultipartInfo
	err := s.listUploads(ctx, bucket, key, func(u minio.ObjectMultipartInfo) error {
		if u.Key == key {
			out = append(out, u)
		}
		return nil
	})
	return out, err
}

// listUploads calls f with each upload in progress under prefix.
func (s *Store) listUploads(ctx context.Context, bucket, prefix string, f func(minio.ObjectMultipartInfo) error) error {
	keyMarker, idMarker := "", ""
	for {
		res, err := s.core.ListMultipartUploads(ctx, bucket, prefix, keyMarker, idMarker, "", 1000)
		if err != nil {
			return classify(err)
		}
		for _, u := range res.Uploads {
			if err := f(u); err != nil {
				return err
			}
		}
		if !res.IsTruncated || (res.NextKeyMarker == keyMarker && res.NextUploadIDMarker == idMarker) {
			return nil
		}
		keyMarker, idMarker = res.NextKeyMarker, res.NextUploadIDMarker
	}
}

// uploadBytes sums the sizes of the parts an upload holds.
func (s *Store) uploadBytes(ctx context.Context, bucket, key, id string) (int64, error) {
	var total int64
	marker := 0
	for {
		res, err := s.core.ListObjectParts(ctx, bucket, key, id, marker, 1000)
		if err != nil {
			return total, classify(err)
		}
		for _, p := range res.ObjectParts {
			total += p.Size
		}
		if !res.IsTruncated || res.NextPartNumberMarker <= marker {
			return total, nil
		}
		marker = res.NextPartNumberMarker
	}
}

// abortOlder aborts the uploads of key in ups that began before ours (or
// in the same second): the
// debris of earlier attempts (a killed worker's), or a duplicate of the
// same job still sending the same bytes, which then starts again after
// this object (NoSuchUpload is transient: see putMultipart). Best effort:
// what fails here, AbortStaleUploads and the server's own rules remove.
func (s *Store) abortOlder(ctx context.Context, bucket, key, ours string, ups []minio.ObjectMultipartInfo) {
	var began time.Time
	for _, u := range ups {
		if u.UploadID == ours {
			began = u.Initiated
		}
	}
	if began.IsZero() {
		return
	}
	for _, u := range ups {
		// Not After: servers report the time in whole seconds.
		if u.UploadID != ours && !u.Initiated.After(began) {
			_ = s.core.AbortMultipartUpload(ctx, bucket, key, u.UploadID)
		}
	}
}

// StaleUploads is what AbortStaleUploads found and removed.
type StaleUploads struct {
	Aborted int   // uploads aborted
	Bytes   int64 // bytes of parts they held
	Young   int   // uploads in progress under the prefixes, younger than the age, left alone
}

// AbortStaleUploads aborts the multipart uploads under the allow-list's
// writable rules (each bucket, or each of its prefixes) that began more than
// olderThan ago, by the server's clock as the listing reports it: a
// worker's upload of an output lasts seconds to minutes, so one hours old
// was left by a sender that died. Read-only rules are never touched. Errors
// of one rule do not stop the others; they are joined in the result.
func (s *Store) AbortStaleUploads(ctx context.Context, olderThan time.Duration) (StaleUploads, error) {
	var res StaleUploads
	var errs []error
	cutoff := time.Now().Add(-olderThan)
	seen := map[string]bool{}
	for _, a := range s.allow {
		if a.ReadOnly {
			continue
		}
		prefixes := a.Prefixes
		if len(prefixes) == 0 {
			prefixes = []string{""}
		}
		for _, p := range prefixes {
			err := s.listUploads(ctx, a.Bucket, p, func(u minio.ObjectMultipartInfo) error {
				if seen[a.Bucket+"\x00"+u.UploadID] {
					return nil
				}
				seen[a.Bucket+"\x00"+u.UploadID] = true
				if !u.Initiated.Before(cutoff) {
					res.Young++
					return nil
				}
				n, _ := s.uploadBytes(ctx, a.Bucket, u.Key, u.UploadID)
				if err := s.core.AbortMultipartUpload(ctx, a.Bucket, u.Key, u.UploadID); err != nil {
					if !isNoSuchUpload(err) {
						errs = append(errs, fmt.Errorf("abort upload %s of s3://%s/%s: %w", u.UploadID, a.Bucket, u.Key, classify(err)))
					}
					return nil
				}
				res.Aborted++
				res.Bytes += n
				return nil
			})
			if err != nil && !errors.Is(err, storage.ErrNotFound) { // a bucket not made yet holds none
				errs = append(errs, fmt.Errorf("list uploads under s3://%s/%s: %w", a.Bucket, p, err))
			}
		}
	}
	return res, errors.Join(errs...)
}

// isNoSuchUpload reports whether err is S3's NoSuchUpload: the upload is
// gone, aborted by someone else (another upload of the key that completed,
// the stale-upload cleanup, the server's own rules) or completed.
func isNoSuchUpload(err error) bool {
	return minio.ToErrorResponse(err).Code == "NoSuchUpload"
}

// uploadErr classifies an error of one request of our own multipart
// upload: NoSuchUpload means the upload was aborted under us, which a new
// upload fixes (transient), not a missing object.
func uploadErr(err error) error {
	if isNoSuchUpload(err) {
		return &transient{fmt.Errorf("%w: the multipart upload was aborted while it ran (by a newer upload of the key or the stale-upload cleanup): %v", storage.ErrUnavailable, err)}
	}
	return classify(err)
}
