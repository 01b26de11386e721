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
# The three variants that left the default's spread in run 35
# (bench/results/2026-12-06-h100-cuda-c54d6da.md) and the first two
# together, each twice, alternated with the default, at the dims of c0
# and c7 and two controls. Run 35's 18 variants are in git history.
G='RMSGRAD_CUDA_CLASS_GEOM'
M='RMSGRAD_CUDA_MAX_BLOCKS_PER_SM'
N='RMSGRAD_NOOP=1'
A="$G=0:2x128x4+$M=16"
B='RMSGRAD_CUDA_NVRTC_OPTS=-DRMS_C7_S=2 -DRMS_C7_R=2'
C="$G=7:2x128x4+$M=16"
D="$A+$B"
V="$N;$A;$B;$C;$N;$A;$B;$C;$D;$N;$D"
V=${CALL_VARIANTS:-$V} # another list, in the same form
: "${VDIMS:=1024,1152,1536,1920,2048,4096,5120}"
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
