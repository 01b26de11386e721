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
# Runs 37-39 (docs/cuda.md, Width classes chosen on the H100) made c0
# and c7 blocks of up to 128 threads, two chunks each, four blocks a SM
# (c7 with two rows in registers), and sent 4480-5120 f32 to c5; run 40
# measured them on an H100. Here, meant for an H200 (the targets name it):
# the conformance suite and the bench, then c54d6da's c0 and c7 (O) and
# its c4 end (P: 4480-5120 back in c4) beside the defaults (N), then make
# bench on the host and the f32 harness.
G='RMSGRAD_CUDA_CLASS_GEOM'
N='RMSGRAD_NOOP=1'
O="$G=0:1x256x3,7:1x256x3+RMSGRAD_CUDA_NVRTC_OPTS=-DRMS_C7_S=4"
P="$G=4:4x320x2/1280"
V="$N;$O;$P;$N;$O;$P;$N"
V=${CALL_VARIANTS:-$V} # another list, in the same form
: "${VDIMS:=1024,1152,1536,2048,4224,4352,4480,4864,5120,5248}"
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
