#!/usr/bin/env bash
# One device call of up to 600 s (run by the device tool with carry
# [".devrun", ".devcarry"], after
#   CGO_ENABLED=0 go test -c -ldflags "-s -w" -o .devrun/bin/cuda.test ./cuda/
#   scripts/gpu-host-bench.sh pack):
# conf and bench (the table, the torch peers, the sweep of every dim);
# then the geometry variants below (docs/cuda.md: S and R rows per class,
# RMSGRAD_CUDA_CLASS_GEOM); then, if time is left, make bench on the host
# and the f32 harness. Usage: scripts/cuda-device-call.sh $OUT
# (CALL_VARIANTS: another variant list; STEPS, VDIMS: see below).
OUT=${1:?}
V='RMSGRAD_NOOP=1'
for o in '-DRMS_C0_S=1 -DRMS_C0_R=1' '-DRMS_C0_S=2 -DRMS_C0_R=2' '-DRMS_C1_S=2 -DRMS_C1_R=2' \
	'-DRMS_C3_S=1 -DRMS_C3_R=1' '-DRMS_C4_S=2 -DRMS_C4_R=2' '-DRMS_C7_S=2 -DRMS_C7_R=2' '-DRMS_C8_S=2 -DRMS_C8_R=1'; do
	V="$V;RMSGRAD_CUDA_NVRTC_OPTS=$o"
done
G='RMSGRAD_CUDA_CLASS_GEOM'
M='RMSGRAD_CUDA_MAX_BLOCKS_PER_SM'
V="$V;$G=0:8x32x8+$M=32+RMSGRAD_CUDA_NVRTC_OPTS=-DRMS_C0_S=2 -DRMS_C0_R=2"
V="$V;$G=0:4x64x8+$M=32+RMSGRAD_CUDA_NVRTC_OPTS=-DRMS_C0_S=2 -DRMS_C0_R=2"
V="$V;$G=0:2x128x4+$M=16"
V="$V;$G=7:4x64x6+$M=32+RMSGRAD_CUDA_NVRTC_OPTS=-DRMS_C7_S=2 -DRMS_C7_R=2"
V="$V;$G=7:2x128x4+$M=16"
V="$V;$G=1:4x128x4+$M=16"
V="$V;$G=3:2x512x1+$M=16"
V="$V;$G=4:8x160x2+$M=16"
V="$V;$G=4:2x640x1+$M=16"
V="$V;$G=8:4x128x4+$M=16"
V="$V;$G=8:1x512x2+$M=16"
V="$V;RMSGRAD_NOOP=1"
V=${CALL_VARIANTS:-$V} # another list, in the same form
export BIN=.devrun/bin HOSTBENCH_TIMEOUT=170 HOSTBENCH_FLAGS='-only e2e -repeat 3 -inproc-backend cuda'
scripts/cuda-device-run.sh "$OUT/a" "${STEPS:-conf bench}"
echo "after a: ${SECONDS}s"
VARIANTS="$V" VDIMS=${VDIMS:-1024,1536,2048,2560,3584,3840,4096,4608,5120,6144} VDTYPES=f32,bf16 \
	timeout $((590 - SECONDS)) scripts/cuda-device-run.sh "$OUT/v" variants
echo "after v: ${SECONDS}s"
[ $((590 - SECONDS)) -gt 180 ] && timeout $((590 - SECONDS)) scripts/cuda-device-run.sh "$OUT/b" hostbench
left=$((585 - SECONDS))
[ $left -gt 40 ] && HARNESS=f32 timeout $left scripts/cuda-device-run.sh "$OUT/h" harness
echo "total ${SECONDS}s"
