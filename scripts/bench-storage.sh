#!/usr/bin/env bash
# Storage benchmarks (storage/s3 against a real versitygw started by the
# benchmark): Router.Fetch and Router.Write vs raw minio-go GetObject ->
# io.Discard and PutObject from a bytes.Reader, same run, same server. Prints
# a ratio table per size: ours/raw rate (target >= 90%; measured with raw and
# ours interleaved per iteration, so load drift on a shared machine cancels)
# and bytes allocated per fetch relative to the tensor size (target < 1%).
# Medians over COUNT runs. A second table puts Write next to raw plus the
# sha256 of the tensor timed in the same loop: the header that carries the
# digest goes first, so a single PUT cannot start before the hash ends.
# versitygw runs with VGW_QUIET (no access log): the harness copies the
# server's output into a buffer in the benchmark's process, which would
# count in B/op. Fetch B/op is also shown under a cancellable context (the
# read fast path then arms a context.AfterFunc per GET).
#   BENCHTIME=1s COUNT=5 scripts/bench-storage.sh
#   BENCH=^BenchmarkWrite$ BENCHTIME=2s COUNT=5 scripts/bench-storage.sh   # writes only
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:$(go env GOPATH)/bin"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench "${BENCH:-^Benchmark(Fetch|Write)$}" -benchtime="${BENCHTIME:-1s}" -count="${COUNT:-5}" ./storage/s3/ | tee "$out" | grep -E '^(Benchmark|ok|FAIL|---)' >&2
/usr/bin/python3 - "$out" <<'PY'
import re, statistics, sys
sizes = {"32KiB": 32 << 10, "1MiB": 1 << 20, "64MiB": 64 << 20}
runs, pairs = {}, {}
line_re = re.compile(r"^Benchmark(\w+)/size=(\w+)/impl=([\w-]+)-\d+\s+\d+\s+[\d.]+ ns/op\s+(.*)$")
for line in open(sys.argv[1]):
    m = line_re.match(line)
    if not m:
        continue
    op, size, impl, rest = m.groups()
    metrics = {unit: float(v) for v, unit in re.findall(r"([\d.e+-]+) (\S+)", rest)}
    if impl in ("pair", "pair-head"):
        pairs.setdefault((op if impl == "pair" else "Head+Fetch", size), []).append(metrics)
    else:
        runs.setdefault((op, size, impl), []).append(metrics)
med = statistics.median
def m(rows, key):
    return med([r[key] for r in rows]) if rows else float("nan")
print("| op | size | raw MB/s | ours MB/s | ours/raw | >= 90% | ours B/op (allocs) | raw B/op | ours B/op / size | < 1% |")
print("|---|---|---:|---:|---:|---|---:|---:|---:|---|")
for op in ("Fetch", "Write"):
    for size, n in sizes.items():
        p = pairs.get((op, size))
        ours, raw = runs.get((op, size, "ours")), runs.get((op, size, "raw"))
        if not p or not ours:
            continue
        ratio = m(p, "ours/raw")
        b, a = m(ours, "B/op"), m(ours, "allocs/op")
        alloc = ("met" if b / n < 0.01 else "not met") if op == "Fetch" else "-"
        print(f"| {op} | {size} | {m(p, 'raw-MB/s'):.1f} | {m(p, 'ours-MB/s'):.1f} | {ratio:.0%} | {'met' if ratio >= 0.9 else 'not met'} "
              f"| {b:.0f} ({a:.0f}) | {m(raw, 'B/op'):.0f} | {b / n:.2%} | {alloc} |")
for size, n in sizes.items():
    p, h = pairs.get(("Head+Fetch", size)), runs.get(("Fetch", size, "ours-head"))
    if p and h:
        ratio = m(p, "ours/raw")
        print(f"| Head+Fetch | {size} | {m(p, 'raw-MB/s'):.1f} | {m(p, 'ours-MB/s'):.1f} | {ratio:.0%} | {'met' if ratio >= 0.9 else 'not met'} "
              f"| {m(h, 'B/op'):.0f} ({m(h, 'allocs/op'):.0f}) | {m(runs.get(('Fetch', size, 'raw')), 'B/op'):.0f} | {m(h, 'B/op') / n:.2%} | (info) |")
for size, n in sizes.items():
    c = runs.get(("Fetch", size, "ours-ctx"))
    if c:
        print(f"| Fetch, cancellable ctx | {size} | | | | | {m(c, 'B/op'):.0f} ({m(c, 'allocs/op'):.0f}) | {m(runs.get(('Fetch', size, 'raw')), 'B/op'):.0f} | {m(c, 'B/op') / n:.2%} | {'met' if m(c, 'B/op') / n < 0.01 else 'not met'} |")
hashed = [(size, pairs.get(("Write", size))) for size in sizes]
hashed = [(size, p) for size, p in hashed if p and "ours/(raw+sha256)" in p[0]]
if hashed:
    print("\n| Write | sha256 of the tensor (µs, same run) | ours/raw | ours/(raw+sha256) |")
    print("|---|---:|---:|---:|")
    for size, p in hashed:
        print(f"| {size} | {m(p, 'sha256-us'):.0f} | {m(p, 'ours/raw'):.0%} | {m(p, 'ours/(raw+sha256)'):.0%} |")
k = len(next(iter(pairs.values())))
print(f"\nRates and ratios: medians over {k} runs of interleaved pairs (raw and ours alternate every iteration, same server). "
      "B/op: separate ReportAllocs sub-benchmarks. raw = minio-go GetObject->io.Discard / PutObject(bytes.Reader), same PUT options (unsigned payload).")
PY
