#!/usr/bin/env bash
# Everything the cuda backend needs a GPU for, in one call of the GPU machine
# (no Go there: cross-build here first, CGO_ENABLED=0):
#   CGO_ENABLED=0 go test -c -o bin/cuda.test ./cuda/    (BIN=dir: binaries from elsewhere)
#   CGO_ENABLED=0 go build -o bin/ ./cmd/...              (the e2e step only)
#   scripts/gpu-host-bench.sh pack                         (the hostbench step only)
#   scripts/cuda-device-run.sh OUTDIR [steps]   (steps: ptxas conf bench variants harness e2e hostbench)
# Logs go to OUTDIR (all.tar.gz: the device tool brings back few files); the
# summary is printed last. The ptxas step compiles the kernels with nvcc
# first and stops the run when they do not compile.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/cuda-run}}
steps=${2:-ptxas conf bench variants e2e}
logs=$(mktemp -d)
mkdir -p "$out"
summary=()
has() { [[ " $steps " == *" $1 "* ]]; }
t00=$(date +%s)
# snap copies the logs so far to OUTDIR (a run cut short still brings them).
snap() { tar -C "$logs" -czf "$out/all.tar.gz" . 2>/dev/null; }
finish() {
	echo
	echo "==== summary ($(($(date +%s) - t00))s)"
	printf '%s\n' "${summary[@]}"
	[ -f "$logs/variants.log" ] && cat "$logs/variants.log"
	[ -f "$logs/harness.log" ] && grep -E '^[0-9]|of copy|skipped' "$logs/harness.log"
	[ -f "$logs/bench.log" ] && sed -n '/^| shape/,$p' "$logs/bench.log"
	tar -C "$logs" -czf "$out/all.tar.gz" .
	exit 0
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$logs/gpu.txt"

if has ptxas && command -v nvcc >/dev/null; then
	if ! nvcc -arch=sm_90 -cubin -Xptxas -v -o /tmp/rms.cubin shaders/rms_norm_backward.cu >"$logs/ptxas.log" 2>&1; then
		summary+=("ptxas: nvcc FAILED: $(head -c 3000 "$logs/ptxas.log")")
		finish
	fi
	summary+=("ptxas: $(python3 - "$logs/ptxas.log" <<'P'
import re, sys
name, spill, out = None, "?", []
for l in open(sys.argv[1]):
    m = re.search(r"Compiling entry function '(\w+)'", l)
    if m:
        name = m.group(1)
        continue
    m = re.search(r"(\d+) bytes spill stores", l)
    if m:
        spill = m.group(1)
    m = re.search(r"Used (\d+) registers", l)
    if m and name:
        out.append(f"{name.replace('rms_norm_backward_', '')} {m.group(1)} regs {spill} B spilled")
        name = None
print("; ".join(out))
P
)")
fi

if has conf; then
	# Open first (NVRTC compiles the kernels): nothing else runs without it.
	if ! RMSGRAD_REQUIRE_CUDA=1 timeout 240 "${BIN:-bin}"/cuda.test -test.v -test.run '^TestOpen$' >"$logs/open.log" 2>&1; then
		summary+=("Open FAILED: $(head -c 4000 "$logs/open.log")")
		finish
	fi
	grep -E 'registers|NVRTC' "$logs/open.log"
	t0=$(date +%s)
	RMSGRAD_REQUIRE_CUDA=1 timeout 240 "${BIN:-bin}"/cuda.test -test.v -test.run 'TestConformance|TestReserve|TestPoolLimitOnGPU|TestSteadyState|TestJobEntryLayout|TestPlan|TestMapped|TestGeometry|TestClassOf|TestGroups' \
		-test.timeout 8m >"$logs/conformance.log" 2>&1
	rc=$?
	summary+=("conformance on GPU: rc=$rc in $(($(date +%s) - t0))s; $(grep -c -- '--- PASS' "$logs/conformance.log") passed, $(grep -c -- '--- FAIL' "$logs/conformance.log") failed, $(grep -c -- '--- SKIP' "$logs/conformance.log") skipped; TestConformance subtests passed: $(grep -cE -- '^ +--- PASS: TestConformance/' "$logs/conformance.log")")
	grep -E -- '--- FAIL|device |_test.go' "$logs/conformance.log" | grep -v 'map bytes' | head -40
	snap
fi

if has bench; then
	t0=$(date +%s)
	BIN=${BIN:-bin} TAG=main timeout 300 scripts/bench-cuda.sh "$logs" >"$logs/bench.log" 2>&1
	summary+=("bench rc=$? in $(($(date +%s) - t0))s")
	grep -E 'jobs [0-9]+x[0-9]+:|Error|FAIL' "$logs/bench.log" | head -20
	snap
fi

if has variants; then
	# VARIANTS: ";"-separated sets of "+"-separated environment
	# assignments (geometry and NVRTC knobs of the cuda backend; a value
	# may hold spaces) to run the dim sweep with, over VDIMS in VDTYPES,
	# beside the default.
	IFS=';' read -ra vs <<<"${VARIANTS:-RMSGRAD_CUDA_STAGES=3}"
	for v in "${vs[@]}"; do
		IFS='+' read -ra kv <<<"$v"
		env "${kv[@]}" RMSGRAD_CUDA_SWEEP_DIMS=${VDIMS:-1152,2560,3584,5120,6144,7168} RMSGRAD_CUDA_SWEEP_DTYPES=${VDTYPES:-f32} \
			RMSGRAD_REQUIRE_CUDA=1 RMSGRAD_CUDA_SWEEP=/tmp/variant.json timeout 150 "${BIN:-bin}"/cuda.test -test.run '^TestBenchSweep$' -test.v 2>&1 |
			grep -E 'of copy|FAIL|Error' | awk -v p="[$v] " '{print p $0}' >>"$logs/variants.log"
		snap # a run cut short still brings the variants so far
	done
fi

if has harness && command -v nvcc >/dev/null; then
	# The kernel-geometry harness (cuda/variants/rows.cu), its variant sets
	# in HARNESS (bf16, f32, next; all when empty).
	t0=$(date +%s)
	if nvcc -O3 -arch=sm_90 -o /tmp/rows cuda/variants/rows.cu >"$logs/harness-build.log" 2>&1; then
		timeout 300 /tmp/rows ${HARNESS:-} >"$logs/harness.log" 2>&1
		summary+=("harness (${HARNESS:-all}): rc=$? in $(($(date +%s) - t0))s")
	else
		summary+=("harness: nvcc FAILED: $(head -c 2000 "$logs/harness-build.log")")
	fi
	snap
fi

if has e2e; then
	dir=$(mktemp -d)
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	http=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	"${BIN:-bin}"/worker --dev --dev-redis "127.0.0.1:$port" --dev-dir "$dir/data" --backend cuda --http "127.0.0.1:$http" >"$logs/worker.log" 2>&1 &
	wpid=$!
	for _ in $(seq 200); do
		python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$http/readyz')" 2>/dev/null && break
		kill -0 $wpid 2>/dev/null || break
		sleep 0.1
	done
	t0=$(date +%s.%N)
	timeout 120 "${BIN:-bin}"/enqueue synth --redis "127.0.0.1:$port" --root "$dir/data" --count 200 --shape 8x1024,64x4096,1x257,7x5120,32x768,2x32,512x4096 --wait >"$logs/enqueue.log" 2>&1
	rc=$?
	t1=$(date +%s.%N)
	kill -TERM $wpid
	wait $wpid
	wrc=$?
	summary+=("e2e: enqueue synth rc=$rc ($(tail -1 "$logs/enqueue.log")) in $(python3 -c "print(round($t1-$t0,2))")s, worker exit $wrc after SIGTERM; backend: $(grep -o '"backend":"[a-z]*","device":"[^"]*"' "$logs/worker.log" | head -1)")
	rm -rf "$dir"
fi

if has hostbench; then
	# make bench on this host (scripts/gpu-host-bench.sh run), flags in
	# HOSTBENCH_FLAGS; HOSTBENCH2_FLAGS, when set, a second run.
	for n in 1 2; do
		v=HOSTBENCH_FLAGS
		[ $n = 2 ] && v=HOSTBENCH2_FLAGS
		[ -z "${!v:-}" ] && continue
		t0=$(date +%s)
		# shellcheck disable=SC2086
		timeout "${HOSTBENCH_TIMEOUT:-200}" scripts/gpu-host-bench.sh run "/tmp/hostbench$n" ${!v} >"$logs/hostbench$n.log" 2>&1
		rc=$?
		cp "/tmp/hostbench$n/bench.md" "$logs/hostbench$n.md" 2>/dev/null
		summary+=("hostbench $n (${!v}): rc=$rc in $(($(date +%s) - t0))s")
		grep -E '^\| (e2e|batching|variant|before/after|storage)' "$logs/hostbench$n.md" 2>/dev/null | cut -c1-400
		snap
	done
fi
finish
