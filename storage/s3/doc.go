// Package s3 is the S3 Store, on github.com/minio/minio-go/v7: s3://bucket/key
// URIs against one endpoint whose address, region, credentials and TLS come
// from the worker's configuration (never from a job), limited to the
// buckets and key prefixes of Config.Allow.
//
// Reads are GETs streamed from the response body straight into the caller's
// buffer (minio.Core, without the buffered minio.Object wrapper): a range
// GET for a tensor inside an object, or a plain GET whose small header
// prefix is dropped when the tensor is the object's tail (servers answer
// whole objects faster; see ReadAtSized). A transfer cut off or stalled
// mid-body (Config.StallTimeout) resumes with a range GET of the remainder
// pinned by If-Match to the version it started on, so a retried read never
// mixes two versions and never returns a short tensor. GETs and HEADs go
// through a minimal HTTP/1.1 client (fastget.go) over a pool of keep-alive
// connections that allocates nothing per request; answers it does not
// handle (redirects, chunked or unsized bodies, unparsable heads) are sent
// again through minio-go, and error answers are decoded into the same
// minio.ErrorResponse, so retries and error classes are the same on both
// paths. Config.DisableFastPath turns it off. The reads that go through
// minio-go are signed by readSigner (sign.go); both signers derive the
// SigV4 key once a day instead of per request.
//
// Writes are one PUT, or a multipart upload of Config.PartSize parts (16
// MiB by default) above Config.MultipartThreshold (128 MiB); both become
// visible only when complete. A multipart upload
// of a Write body (io.ReaderAt) is the store's own: parts 2..N go up first,
// 4 at a time, straight from the compute buffers, while Write hashes the
// tensors, and part 1, which holds the header with the sha256s, is the S3
// minimum of 5 MiB and goes last; each part carries a CRC32C header and
// the completion their composite, as minio-go's own multipart upload
// does (with trailers). A single PUT carries the CRC32C of its whole body
// in a header, so a body cut short is refused rather than stored; the
// sums are taken from the compute buffers while Write still hashes
// (checksum.go). A single PUT of a Write body goes through the same
// minimal client as the reads (fastput.go), which writes the header and
// the compute buffers to the connection without copying them. Payloads go unsigned unless Config.SignPayload (Write
// records a sha256 per tensor).
//
// Transient failures (5xx, 429/SlowDown, stalls, timeouts, refused or reset
// connections, bodies cut short) are retried with storage.Retry (capped
// exponential backoff, full jitter, context honoured); 4xx answers are not,
// and credential errors (including versitygw's 404 XAdminUserNotFound) are
// storage.ErrAccess without any key material in the text.
package s3
