#!/usr/bin/env bash
# One device call (up to 600 s) that tunes the H200's geometry profile
# (docs/cuda.md, "Geometry by device"), run by the device tool with carry
# [".devrun"] after
#   CGO_ENABLED=0 go test -c -ldflags "-s -w" -o .devrun/bin/cuda.test ./cuda/
# Usage: scripts/cuda-leads-call.sh $OUT (ANY_CARD=1: on a card other than
# an H200 too; END: the seconds it may take, default 588).
# 1. Discovery, each variant through cuda.TestBenchSweep at a few dims
#    beside the device's profile (N): the profile against the defaults
#    (D), alternated, at the dims it changes; the geometry leads of the
#    half classes c8 and c11 (bf16 4096 and 8192), of c0-c3 (f32
#    1024-4096), of c5-c6 (f32 5376-8192), and the RMS_NARROW8 and
#    RMS_PDL_TRIGGER variants.
# 2. scripts/cuda_leads_combine.py takes, per class, the variant that beat
#    N by a point or more on the class's dims (and lost no more than one at
#    any), and combines them; RMS_NARROW8 counts as a class of the half
#    dims, RMS_PDL_TRIGGER and the profile against the defaults are left
#    to be read by hand.
# 3. Under the combination: the conformance suite, the bench (the table
#    with the torch peers, the sweep of every dim), then the combination
#    alternated with N at its dims. A combination that wins goes into the
#    profile (cuda/geometry.go) by hand, with the figures.
OUT=${1:?}
mkdir -p "$OUT"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
case "$card" in *H200*) ;; *) [ "${ANY_CARD:-0}" = 1 ] || { echo "not an H200, stopping"; exit 3; } ;; esac
export BIN=${BIN:-.devrun/bin}
N='RMSGRAD_NOOP=1'
D='RMSGRAD_CUDA_PROFILE=default'
G='RMSGRAD_CUDA_CLASS_GEOM'
O='RMSGRAD_CUDA_NVRTC_OPTS'
left() { echo $((${END:-588} - SECONDS)); }
cap() { local l; l=$(left); echo $((l < $1 ? l : $1)); }
VARIANTS="$N;$D;$N;$D;$N" VDIMS=4480,4608,4864,5120,5248,6144,6656,7168,8192 VDTYPES=f32 \
	timeout $(cap 200) scripts/cuda-device-run.sh "$OUT/v" variants >/dev/null
echo "after v: ${SECONDS}s"
VARIANTS="$N;$G=8:4x128x4s;$G=8:4x128x6s+$O=-DRMS_C8_S=1 -DRMS_C8_R=1;$G=8:2x256x4s+$O=-DRMS_C8_S=1 -DRMS_C8_R=1;$O=-DRMS_C8_R=1;$O=-DRMS_C11_R=1;$G=11:4x256x3s+$O=-DRMS_C11_S=1 -DRMS_C11_R=1;$O=-DRMS_NARROW8=1;$N" \
	VDIMS=4096,8192 VDTYPES=bf16 timeout $(cap 90) scripts/cuda-device-run.sh "$OUT/lb" variants >/dev/null
echo "after lb: ${SECONDS}s"
VARIANTS="$N;$G=0:1x256x3;$G=0:2x128x6+$O=-DRMS_C0_S=2 -DRMS_C0_R=2;$G=0:1x256x4+$O=-DRMS_C0_S=2 -DRMS_C0_R=2;$O=-DRMS_C1_S=2 -DRMS_C1_R=2;$G=1:2x256x4;$O=-DRMS_C2_R=1;$G=2:3x256x3+$O=-DRMS_C2_S=1 -DRMS_C2_R=1;$O=-DRMS_C3_R=2;$G=3:4x256x3s+$O=-DRMS_C3_S=1 -DRMS_C3_R=1;$O=-DRMS_PDL_TRIGGER=1;$N" \
	VDIMS=1024,1280,1536,1792,2048,2304,2560,3072,3328,3584,4096 VDTYPES=f32 timeout $(cap 170) scripts/cuda-device-run.sh "$OUT/lf" variants >/dev/null
echo "after lf: ${SECONDS}s"
VARIANTS="$N;$G=5:4x384x2s+$O=-DRMS_C5_S=1 -DRMS_C5_R=1;$G=6:4x512x2s+$O=-DRMS_C6_S=1 -DRMS_C6_R=1;$N" \
	VDIMS=5376,5760,6144,6656,7168,8192 VDTYPES=f32 timeout $(cap 60) scripts/cuda-device-run.sh "$OUT/lc" variants >/dev/null
echo "after lc: ${SECONDS}s"
logs=()
for s in v lb lf lc; do
	mkdir -p "/tmp/x$s" && tar -C "/tmp/x$s" -xzf "$OUT/$s/all.tar.gz" 2>/dev/null && cp "/tmp/x$s/variants.log" "$OUT/variants-$s.log" && logs+=("$OUT/variants-$s.log")
done
cat "${logs[@]}"
python3 scripts/cuda_leads_combine.py "${logs[@]}" >"$OUT/combo.env" 2>"$OUT/combo.txt"
cat "$OUT/combo.txt" "$OUT/combo.env"
GEOM=$(sed -n 's/^GEOM=//p' "$OUT/combo.env")
OPTS=$(sed -n 's/^OPTS=//p' "$OUT/combo.env")
DIMS=$(sed -n 's/^DIMS=//p' "$OUT/combo.env")
DTS=$(sed -n 's/^DTYPES=//p' "$OUT/combo.env")
# Under the combination (the profile alone when empty): conformance, the
# bench, then the combination beside N at its dims.
export RMSGRAD_CUDA_CLASS_GEOM="$GEOM" RMSGRAD_CUDA_NVRTC_OPTS="$OPTS"
l=$(left)
[ "$l" -gt 60 ] && timeout $((l - 5)) scripts/cuda-device-run.sh "$OUT/a" "conf bench"
echo "after a: ${SECONDS}s"
unset RMSGRAD_CUDA_CLASS_GEOM RMSGRAD_CUDA_NVRTC_OPTS
C="$G=$GEOM+$O=$OPTS"
l=$(left)
[ -n "$DIMS" ] && [ "$l" -gt 30 ] && VARIANTS="$N;$C;$N;$C" VDIMS=$DIMS VDTYPES=$DTS timeout $l scripts/cuda-device-run.sh "$OUT/c" variants
echo "total ${SECONDS}s"
