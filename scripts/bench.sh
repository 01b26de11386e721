#!/usr/bin/env bash
# What make bench runs (after make build): installs or locates redis-server,
# versitygw and g++, then runs cmd/bench, which starts its own servers on
# free loopback ports, measures the ceilings and rmsgrad, prints the table
# and writes report/bench.md and report/bench.png.
#
# Extra arguments go to cmd/bench, e.g. scripts/bench.sh -scale 4 or
# scripts/bench.sh -only queue,storage. BENCH_FLAGS does the same from make.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
deps_servers
deps_cxx
redis-server --version; versitygw --version | sed -n 1p
go build -o bin/bench ./cmd/bench
# shellcheck disable=SC2086
exec bin/bench -out report -worker bin/worker ${BENCH_FLAGS:-} "$@"
