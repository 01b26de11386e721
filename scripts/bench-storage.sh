#!/usr/bin/env bash
# Storage benchmarks (storage/s3 against a real versitygw started by the
# benchmark): Router.Fetch and Router.Write vs raw minio-go GetObject ->
# io.Discard and PutObject from a bytes.Reader, same run, same server. Prints
# a ratio table per size: ours/raw rate (target >= 90%) and bytes allocated
# per fetch relative to the tensor size (target < 1%). Medians over COUNT runs.
#   BENCHTIME=1s COUNT=5 scripts/bench-storage.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:$(go env GOPATH)/bin"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench '^Benchmark(Fetch|Write)$' -benchtime="${BENCHTIME:-1s}" -count="${COUNT:-5}" ./storage/s3/ | tee "$out" | grep -E '^(Benchmark|ok|FAIL|---)' >&2
/usr/bin/python3 - "$out" <<'PY'
import re, statistics, sys
sizes = {"32KiB": 32 << 10, "1MiB": 1 << 20, "64MiB": 64 << 20}
runs = {}
pat = re.compile(r"^Benchmark(\w+)/size=(\w+)/impl=([\w-]+)-\d+\s+\d+\s+[\d.]+ ns/op\s+([\d.]+) MB/s\s+(\d+) B/op\s+(\d+) allocs/op")
for line in open(sys.argv[1]):
    m = pat.match(line)
    if m:
        op, size, impl, mbs, bop, aop = m.groups()
        runs.setdefault((op, size, impl), []).append((float(mbs), int(bop), int(aop)))
med = lambda xs: statistics.median(xs)
print("| op | size | raw MB/s | ours MB/s | ours/raw | target | ours B/op (allocs/op) | B/op / size | target |")
print("|---|---|---:|---:|---:|---|---:|---:|---|")
for op, impls in (("Fetch", ("ours", "ours-head")), ("Write", ("ours",))):
    for size, n in sizes.items():
        raw = runs.get((op, size, "raw"))
        for impl in impls:
            ours = runs.get((op, size, impl))
            if not raw or not ours:
                continue
            r, o = med([x[0] for x in raw]), med([x[0] for x in ours])
            b, a = med([x[1] for x in ours]), med([x[2] for x in ours])
            ratio = o / r
            name = op if impl == "ours" else "Head+Fetch"
            alloc_target = "< 1%: " + ("met" if b / n < 0.01 else "not met") if op == "Fetch" else ""
            print(f"| {name} | {size} | {r:.1f} | {o:.1f} | {ratio:.0%} | >= 90%: {'met' if ratio >= 0.9 else 'not met'} | {b:.0f} ({a:.0f}) | {b / n:.3%} | {alloc_target} |")
print(f"\nmedians of {len(next(iter(runs.values())))} runs each; raw = minio-go GetObject->io.Discard / PutObject(bytes.Reader), same PUT options (unsigned payload)")
PY
