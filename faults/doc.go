// Package faults proves the worker's failure model with real processes: the
// built worker binary (and the enqueue CLI) run as separate processes
// against a real redis-server and a real S3 server (versitygw, and MinIO's
// own server where a test says so), and the tests break them the way
// production does.
//
//   - TestKillMidBatch: SIGKILL while a command buffer is in flight (then a
//     restart) and while uploads are half sent (with a second worker
//     running): every job completes, none is lost, every output is bitwise
//     equal to a clean run's. asynq gives an orphaned task back once its
//     30 s lease has expired, 30 s of clock-skew allowance have passed and a
//     recoverer runs (every minute): about 60-120 s after the kill.
//   - TestStorageOutage: versitygw stopped for the equivalent of 30
//     minutes of retry periods (18 s, every retry delay scaled by 1/100)
//     under load: no job uses a retry, none is archived or lost, the worker
//     holds at most its concurrency at its readiness gate while /readyz
//     reports the outage, and carries on when storage is back.
//   - TestKillMultipartDebris: ten workers SIGKILLed mid multipart upload,
//     against versitygw and against MinIO: after recovery every job is
//     complete and no byte of the dead uploads is left on the server.
//   - TestHeaderFlood: 32 jobs whose inputs have 8 MiB headers: peak RSS
//     stays within the stated bound, which includes the header budget.
//   - TestRedisRestart: redis-server stopped (SIGTERM) or crashed
//     (SIGKILL) for 8 s under load, AOF on with appendfsync everysec: no
//     acknowledged job is lost, the worker reconnects and carries on,
//     /readyz names Redis while it is down, and the enqueue CLI fails at
//     once with a clear message.
//   - TestFlood: 2,000 large jobs at once: peak RSS (VmHWM) stays within
//     budget_bytes plus a stated overhead, and nothing that fits is
//     rejected.
//   - TestSoak: 10,000 small jobs at concurrency 64: none lost, duplicates
//     give identical outputs, p50/p99 latency reported.
//
// Each test logs one greppable line starting with FIGURE. The long tests
// skip under -short. The helpers in this package (harness.go) start the
// servers, the worker binary and an S3 proxy that can stall uploads.
package faults
