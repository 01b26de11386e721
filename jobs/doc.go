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
//   - retry.go: backoff for transient failures;
//   - metrics.go: the Prometheus collectors;
//   - shard.go, reshard.go, servers.go: sharded queues (a logical queue
//     over N asynq queues on the masters of a Redis Cluster, the layout
//     record in Redis, the reshard, and the worker's asynq servers, one per
//     shard); redisconn.go: the Cluster connection (docs/scaling.md).
//
// Errors a handler returns are *JobError values naming the job, the tensor
// and its URI; permanent ones wrap asynq.SkipRetry so asynq archives them
// at once with that message, transient ones are retried with RetryDelay.
//
// The package never imports a concrete compute backend or store: the worker
// wires a compute.Backend and a Store in.
package jobs
