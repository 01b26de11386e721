#!/usr/bin/env bash
# CUDA benchmark table (README "CUDA"): runs on the GPU machine with the
# binaries cross-built here (no Go there):
#   CGO_ENABLED=0 go test -c -o bin/cuda.test ./cuda/    (BIN=dir to run the binaries from elsewhere)
#   scripts/bench-cuda.sh [out-dir]
# The Go side (cuda.TestBenchTable) times our kernels on device-resident data
# against a device copy of the same bytes and a c = a + b kernel, in F32 and
# (16384x4096, 32768x8192) in BF16, and 256 small jobs in one command
# buffer; scripts/cuda_peers.py then times the torch peers in the same run
# and dtype and prints one table with ratios. RMSGRAD_CUDA_SHAPES picks the
# rows (e.g. 16384x4096:bf16,32768x8192:bf16).
# RMSGRAD_CUDA_NVRTC_OPTS passes kernel variants (e.g. -DRMS_PF_KMAX=0).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp}}
mkdir -p "$out"
json="$out/cuda-bench${TAG:+-$TAG}.json"
RMSGRAD_REQUIRE_CUDA=1 RMSGRAD_CUDA_BENCH="$json" "${BIN:-bin}"/cuda.test -test.run '^TestBenchTable$' -test.v -test.timeout 15m
PYTHONUNBUFFERED=1 python3 scripts/cuda_peers.py "$json"
