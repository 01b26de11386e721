// Package gateway is rmsgrad's HTTP job API: a stateless front end that
// lets orchestrators in any language post RMSNorm-backward jobs, read their
// state and results, and wait for them, on the same Redis queues that
// jobs.Client uses. Any number of gateways may run behind a load balancer:
// everything they know is in Redis and in the object stores.
//
// One file per moving part:
//
//   - server.go: the Server, its routes and the middleware every API route
//     goes through (metrics, bearer-token auth, per-token rate limits, body
//     size limits);
//   - submit.go: POST /v1/jobs and the batch submit (jobs.Decode's strict
//     schema, the allow-list, jobs.Client.Enqueue's idempotent ids);
//   - wait.go: GET /v1/jobs/{id}, its long-poll wait and the batch wait;
//   - uploads.go: presigned upload and download URLs (S3 through
//     minio-go, the file store through URLs this gateway signs) and the
//     file-store object routes of the zero-setup mode;
//   - auth.go: bearer tokens from files, SHA-256 hashed at rest;
//   - ratelimit.go: a token bucket per token name;
//   - errors.go: every error as JSON, with the worker's messages;
//   - metrics.go: the Prometheus collectors.
//
// openapi.yaml is the API's OpenAPI 3 document, served at /openapi.yaml;
// the package's tests validate every request and answer against it.
package gateway
