// Package s3 is the S3 Store, on github.com/minio/minio-go/v7: s3://bucket/key
// URIs against one endpoint whose address, region, credentials and TLS come
// from the worker's configuration (never from a job), limited to the
// buckets and key prefixes of Config.Allow.
//
// Reads are range GETs streamed by io.ReadFull from the response body
// straight into the caller's buffer (minio.Core, without the buffered
// minio.Object wrapper); a transfer cut off mid-body resumes with a range
// GET of the remainder pinned by If-Match to the version it started on, so
// a retried read never mixes two versions and never returns a short tensor.
// Writes are one PUT, or a multipart upload above Config.PartSize; both
// become visible only when complete. Transient failures (5xx, 429/SlowDown,
// timeouts, refused or reset connections, bodies cut short) are retried with
// storage.Retry; 4xx answers are not.
package s3
