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
# Meant for an H200 (the targets name it; runs 17-50 got H100s): the
# conformance suite and the bench, then beside the defaults (N) O, the
# geometry before 929dd33 (c7 over all of 1152-2048, c6 at two rows a
# barrier), at the dims c12 and c6 moved and the f32 dims that stay
# under 92% on H100s (docs/cuda.md, runs 48-50); then make bench on the
# host and the f32 harness.
G='RMSGRAD_CUDA_CLASS_GEOM'
N='RMSGRAD_NOOP=1'
O="$G=7:2x128x4/256+RMSGRAD_CUDA_NVRTC_OPTS=-DRMS_C6_R=2"
V="$N;$O;$N;$O;$N"
V=${CALL_VARIANTS:-$V} # another list, in the same form
: "${VDIMS:=1024,1152,1536,1920,2048,3840,4096,6272,7168,8192}"
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
