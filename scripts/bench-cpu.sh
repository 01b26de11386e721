#!/usr/bin/env bash
# CPU backend benchmarks as a Markdown table: the backward's MB/s (12 bytes
# per element: read x and dy, write dx) against copy() of the same byte
# count, both measured in the same `go test -bench` run, medians over
# COUNT runs; then the same job with every tensor in BF16 (6 bytes per
# element) against copy() of its bytes. Usage: scripts/bench-cpu.sh [COUNT]
# (default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-5}
out=$(go test -run '^$' -bench 'Backward|Copy|Batch256|Ratio' -benchtime "${BENCHTIME:-1s}" -count "$COUNT" ./compute/cpu)
echo "$out" | grep -E '^(cpu|goos|goarch):' | sed 's/^/    /'
echo "$out" | awk -v count="$COUNT" '
function median(key,   n, i, j, t, a) {
	n = split(vals[key], a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n ? a[int((n + 1) / 2)] : 0
}
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name)
	for (i = 2; i <= NF; i++) {
		if ($(i) == "MB/s") vals[name] = vals[name] " " $(i-1)
		if ($(i) == "jobs/s") jobs[name] = jobs[name] " " $(i-1)
		if ($(i) == "ours/copy") ratio[name] = ratio[name] " " $(i-1)
	}
}
END {
	print ""
	print "| rows x dim | cpu (avx2) MB/s | cpu (scalar Go) MB/s | copy() MB/s | copy() on all cores MB/s | avx2 / copy | avx2 / parallel copy | scalar / copy | avx2 / copy, interleaved |"
	print "|---|---|---|---|---|---|---|---|---|"
	split("8x1024 64x4096 1024x4096 4096x4096 8192x4096", shapes, " ")
	for (s = 1; s <= 5; s++) {
		sh = shapes[s]
		b = median("BenchmarkBackward/best/" sh); sc = median("BenchmarkBackward/scalar/" sh)
		c = median("BenchmarkCopy/serial/" sh); p = median("BenchmarkCopy/parallel/" sh)
		row[s] = sprintf("| %s | %.0f | %.0f | %.0f | %.0f | %.0f%% | %.0f%% | %.0f%% |", sh, b, sc, c, p, 100*b/c, 100*b/p, 100*sc/c)
	}
	for (k in ratio) vals[k] = ratio[k]
	for (s = 1; s <= 5; s++) printf "%s %.0f%% |\n", row[s], 100*median("BenchmarkRatio/f32/" shapes[s])
	print ""
	print "| rows x dim, every tensor BF16 | cpu (vector) MB/s | cpu (scalar Go) MB/s | vector / copy of the same bytes, interleaved |"
	print "|---|---|---|---|"
	for (s = 1; s <= 5; s++) {
		sh = shapes[s]
		printf "| %s | %.0f | %.0f | %.0f%% |\n", sh, median("BenchmarkBackward/best-bf16/" sh), median("BenchmarkBackward/scalar-bf16/" sh), 100*median("BenchmarkRatio/bf16/" sh)
	}
	for (k in jobs) vals[k] = jobs[k]
	one = median("BenchmarkBatch256/one-buffer"); each = median("BenchmarkBatch256/buffer-each")
	print ""
	printf "256 jobs of 8x1024: one command buffer %.0f jobs/s, one command buffer each %.0f jobs/s (ratio %.2f). Medians of %d runs; the interleaved column alternates one backward and one copy() per iteration (BenchmarkRatio), the others are separate benchmarks of the same run.\n", one, each, one/each, count
}'
