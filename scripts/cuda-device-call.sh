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
# Meant for an H200 (the targets name it): the conformance suite and the
# bench with the device's geometry profile (docs/cuda.md, "Geometry by
# device"), then beside it (N) the defaults (D, RMSGRAD_CUDA_PROFILE=
# default), alternated, at the dims the H200 profile changes and at the
# f32 dims furthest under 92% in run 58; then make bench on the host and
# the f32 harness.
N='RMSGRAD_NOOP=1'
D='RMSGRAD_CUDA_PROFILE=default'
V="$N;$D;$N;$D;$N"
# The untried H200 geometry leads: scripts/cuda-leads-call.sh.
V=${CALL_VARIANTS:-$V} # another list, in the same form
: "${VDIMS:=1024,2048,2560,4480,4608,5120,5248,6144,6656,7168,8192}"
export BIN=.devrun/bin HOSTBENCH_TIMEOUT=170 HOSTBENCH_FLAGS='-only e2e -repeat 3 -inproc-backend cuda'
scripts/cuda-device-run.sh "$OUT/a" "${STEPS:-conf bench}"
echo "after a: ${SECONDS}s"
VARIANTS="$V" VDIMS=$VDIMS VDTYPES=${VDTYPES:-f32} \
	timeout $((590 - SECONDS)) scripts/cuda-device-run.sh "$OUT/v" variants
echo "after v: ${SECONDS}s"
[ $((590 - SECONDS)) -gt 180 ] && timeout $((590 - SECONDS)) scripts/cuda-device-run.sh "$OUT/b" hostbench
left=$((585 - SECONDS))
[ $left -gt 40 ] && HARNESS=f32 timeout $left scripts/cuda-device-run.sh "$OUT/h" harness
echo "total ${SECONDS}s"
