#!/usr/bin/env bash
# One device call of up to 600 s (run by the device tool with carry
# [".devrun", ".devcarry"], after
#   CGO_ENABLED=0 go test -c -ldflags "-s -w" -o .devrun/bin/cuda.test ./cuda/
#   scripts/gpu-host-bench.sh pack):
# conf and bench (the table, the torch peers, the sweep of every dim;
# STEPS=none skips them);
# then the geometry variants below (docs/cuda.md: S and R rows per class,
# RMSGRAD_CUDA_CLASS_GEOM); then, if time is left, make bench on the host
# and the f32 harness. Usage: scripts/cuda-device-call.sh $OUT
# (CALL_VARIANTS: another variant list; STEPS, VDIMS: see below).
OUT=${1:?}
# Runs 42-46 (docs/cuda.md) made w and the dw sums piece-major in
# shared memory (c4, c8, c9) and measured them on H100s; after run 46,
# bf16 and f16 5248-6144 moved to a class of their own (c10, run 46's
# variant kernel), not yet run on a GPU as a class. Here, meant for an
# H200 (the targets name it): the conformance suite and the bench, then
# beside the defaults (N): O = c9 over all of 4224-8192 again (c10 and
# c11 take nothing), X = two leads of runs 41 and 46, c7 with w and the dw
# sums in shared memory at six blocks a SM (+3-5 points at bf16
# 1536-2048, -2 at 1024) and c6 at one row a barrier (the harness of run
# 41: f32 7168 at 98.1-98.4% against 95.6-95.9%); then make bench on the
# host and the f32 harness.
G='RMSGRAD_CUDA_CLASS_GEOM'
N='RMSGRAD_NOOP=1'
O="$G=9:4x256x2/1024"
X="$G=7:2x128x6s+RMSGRAD_CUDA_NVRTC_OPTS=-DRMS_C6_R=1"
V="$N;$O;$X;$N;$O;$X;$N"
V=${CALL_VARIANTS:-$V} # another list, in the same form
: "${VDIMS:=1024,1536,2048,5120,5248,5632,6144,6272,7168,8192}"
export BIN=.devrun/bin HOSTBENCH_TIMEOUT=170 HOSTBENCH_FLAGS='-only e2e -repeat 3 -inproc-backend cuda'
scripts/cuda-device-run.sh "$OUT/a" "${STEPS:-conf bench}"
echo "after a: ${SECONDS}s"
VARIANTS="$V" VDIMS=$VDIMS VDTYPES=f32,bf16 \
	timeout $((590 - SECONDS)) scripts/cuda-device-run.sh "$OUT/v" variants
echo "after v: ${SECONDS}s"
[ $((590 - SECONDS)) -gt 180 ] && timeout $((590 - SECONDS)) scripts/cuda-device-run.sh "$OUT/b" hostbench
left=$((585 - SECONDS))
[ $left -gt 40 ] && HARNESS=f32 timeout $left scripts/cuda-device-run.sh "$OUT/h" harness
echo "total ${SECONDS}s"
