// Package jobs is the queue side of rmsgrad: the rmsnorm:backward task
// schema (Job, Decode, Sign/Verify), the Result a worker writes, the Client
// orchestrators enqueue and wait with, and the worker's moving parts, one
// file each:
//
//   - handler.go: one task's way (decode, allow-list, headers, budget,
//     fetch into backend buffers, batch, store, result);
//   - batcher.go: the one goroutine that owns the device and records each
//     batch into one compute.CommandBuffer;
//   - budget.go: bytes in flight;
//   - finite.go, finite16.go: the NaN/Inf scans of F32 and of BF16/F16
//     tensors;
//   - retry.go: backoff for transient failures;
//   - outage.go: what is an outage rather than the job's failure
//     (IsFailure, for asynq), and the readiness Gate that holds jobs while
//     a dependency is down;
//   - metrics.go: the Prometheus collectors;
//   - shard.go, reshard.go, servers.go: sharded queues (a logical queue
//     over N asynq queues on the masters of a Redis Cluster, the layout
//     record in Redis, the reshard, and the worker's asynq servers, one per
//     shard); redisconn.go: the Cluster connection (docs/scaling.md).
//
// Each tensor keeps its own dtype (F32, BF16 or F16): inputs as their
// headers say, dx and dw like x and w unless the job's grad_dtype names one
// dtype for both, r F32; the budget and limits count each tensor's bytes.
//
// A job may pin w to its bytes (w_sha256): the handler checks w against
// the pin and keeps it in a PinCache, from which later jobs pinning the same
// w take it without a request.
//
// Errors a handler returns are *JobError values naming the job, the tensor
// and its URI; permanent ones wrap asynq.SkipRetry so asynq archives them
// at once with that message, transient ones are retried with RetryDelay,
// and outages (storage unavailable, a job held at the gate) without using
// up the job's retries.
//
// The package never imports a concrete compute backend or store: the worker
// wires a compute.Backend and a Store in.
package jobs
