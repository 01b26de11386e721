#!/usr/bin/env bash
# CUDA benchmark table (docs/cuda.md): runs on the GPU machine with the
# binaries cross-built here (no Go there):
#   CGO_ENABLED=0 go test -c -o bin/cuda.test ./cuda/    (BIN=dir to run the binaries from elsewhere)
#   scripts/bench-cuda.sh [out-dir]
# The Go side (cuda.TestBenchTable) times our kernels on device-resident data
# against a device copy of the same bytes and a c = a + b kernel, in F32 and
# (16384x4096, 32768x8192) in BF16, and batches of 256 small and 32 medium
# jobs in one command buffer (GPU time per job; the host side of one
# Execute, small buffers mapped and every buffer copied);
# scripts/cuda_peers.py then times the torch peers in the same run and
# dtype and prints one table with ratios. cuda.TestBenchSweep then times
# every dim multiple of 128 from 1024 to 8192 (16384 rows, F32 and BF16;
# SWEEP=0 skips it). RMSGRAD_CUDA_SHAPES picks the table's rows (e.g.
# 16384x4096:bf16,32768x8192:bf16); RMSGRAD_CUDA_NVRTC_OPTS passes kernel
# variants (e.g. -DRMS_C4_S=2).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp}}
mkdir -p "$out"
json="$out/cuda-bench${TAG:+-$TAG}.json"
RMSGRAD_REQUIRE_CUDA=1 RMSGRAD_CUDA_BENCH="$json" "${BIN:-bin}"/cuda.test -test.run '^TestBenchTable$' -test.v -test.timeout 15m
PYTHONUNBUFFERED=1 python3 scripts/cuda_peers.py "$json"
if [ "${SWEEP:-1}" != 0 ]; then
	sweep="$out/cuda-sweep${TAG:+-$TAG}.json"
	RMSGRAD_REQUIRE_CUDA=1 RMSGRAD_CUDA_SWEEP="$sweep" "${BIN:-bin}"/cuda.test -test.run '^TestBenchSweep$' -test.v -test.timeout 15m |
		grep -E 'of copy|FAIL|Error|ok|PASS'
	cat "${sweep%.json}.md"
fi
