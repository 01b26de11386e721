// Package sha256x2 computes the SHA-256 digests of two messages at once.
//
// With the x86 SHA extensions one message's compression is a chain of
// SHA256RNDS2 instructions, each waiting for the one before: the chain's
// latency, not the unit's throughput, sets the speed. Sum2 runs two
// messages' rounds interleaved, so the second chain fills the first one's
// gaps: 1.9x the single-message rate on the development VM (AMD Turin),
// 1.28x on the Intel Xeon it ran on later (2.17 against 1.69 GB/s,
// BenchmarkSum2), for the blocks both messages have (the rest of the longer one runs alone,
// as fast as crypto/sha256). The digests are crypto/sha256's exactly
// (TestSum2 compares every pair of lengths up to 300 bytes and random
// pairs up to 512 KiB; FuzzSum2), and Sum2 allocates nothing.
//
// The worker uses it for the per-tensor sha256 of every output: the jobs
// of one batch have outputs of the same sizes, so they hash in pairs.
// Without SHA-NI, on other architectures, or with the purego build tag,
// Sum2 is two crypto/sha256 sums.
package sha256x2
