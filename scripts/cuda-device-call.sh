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
# Run 48 (docs/cuda.md) measured c10 and c11 as classes on an H100 and
# two leads beside the defaults; c6 then moved to one row a barrier and
# bf16 and f16 1152-2048 to a class of their own (c12: c7's kernel with w
# and the dw sums in shared memory, six blocks a SM). Here, meant for an
# H200 (the targets name it): the conformance suite and the bench, then
# beside the defaults (N): O = the geometry before (c7 over all of
# 1152-2048 again, c6 at two rows a barrier), K1 and K2 = the sweep's dy
# and dx placed 4352 and 1 MiB (and twice that) into their allocations, a
# probe of whether the slow f32 dims (1024, 1536, 2048: run 48) are the
# streams' relative alignment; then make bench on the host and the f32
# harness.
G='RMSGRAD_CUDA_CLASS_GEOM'
N='RMSGRAD_NOOP=1'
O="$G=7:2x128x4/256+RMSGRAD_CUDA_NVRTC_OPTS=-DRMS_C6_R=2"
K1='RMSGRAD_CUDA_SWEEP_SKEW=4352'
K2='RMSGRAD_CUDA_SWEEP_SKEW=1048576'
V="$N;$O;$K1;$K2;$N;$O;$K1;$K2;$N"
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
