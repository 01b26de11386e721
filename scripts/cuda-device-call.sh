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
# Runs 35-36 (docs/cuda.md, Not done): c0 at 2x128x4 held at 1024 f32 in
# both, but the 256-job batch of 8x1024 (also c0) was not measured with
# it: a second bench with it follows the default's. c7 at 2x128x4 held
# too but spills under NVRTC 11.8 at four rows: here with two. c3 and c4
# (3584-5120 f32 at 88-92%) at one block a SM with two rows in
# registers, as c5 (5248-6144 at 94-97%) runs; each beside the default,
# twice.
G='RMSGRAD_CUDA_CLASS_GEOM'
N='RMSGRAD_NOOP=1'
A="$G=0:2x128x4"
B="$G=7:2x128x4+RMSGRAD_CUDA_NVRTC_OPTS=-DRMS_C7_S=2 -DRMS_C7_R=2"
E="$G=3:4x256x1,4:4x320x1+RMSGRAD_CUDA_NVRTC_OPTS=-DRMS_C3_R=2 -DRMS_C4_R=2"
V="$N;$A;$B;$E;$N;$A;$B;$E;$N"
V=${CALL_VARIANTS:-$V} # another list, in the same form
: "${VDIMS:=1024,1152,1536,2048,3584,3840,4096,4608,4864,5120}"
export BIN=.devrun/bin HOSTBENCH_TIMEOUT=170 HOSTBENCH_FLAGS='-only e2e -repeat 3 -inproc-backend cuda'
scripts/cuda-device-run.sh "$OUT/a" "${STEPS:-conf bench}"
echo "after a: ${SECONDS}s"
[ "${STEPS:-conf bench}" != none ] && RMSGRAD_CUDA_CLASS_GEOM=0:2x128x4 scripts/cuda-device-run.sh "$OUT/a2" bench
echo "after a2: ${SECONDS}s"
VARIANTS="$V" VDIMS=$VDIMS VDTYPES=f32,bf16 \
	timeout $((590 - SECONDS)) scripts/cuda-device-run.sh "$OUT/v" variants
echo "after v: ${SECONDS}s"
[ $((590 - SECONDS)) -gt 180 ] && timeout $((590 - SECONDS)) scripts/cuda-device-run.sh "$OUT/b" hostbench
left=$((585 - SECONDS))
[ $left -gt 40 ] && HARNESS=f32 timeout $left scripts/cuda-device-run.sh "$OUT/h" harness
echo "total ${SECONDS}s"
