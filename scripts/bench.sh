#!/usr/bin/env bash
# What make bench runs: installs or locates redis-server, versitygw (pinned,
# as scripts/test.sh does) and g++, builds bin/worker and bin/bench, then
# runs cmd/bench, which starts its own redis-server and versitygw on free
# loopback ports, measures the ceilings and rmsgrad (bin/worker with its
# default settings), prints the table and writes report/bench.md,
# report/bench.png and the worker's profiles (report/worker-small.*.prof).
# About 5 minutes on two shared cores.
#
# Extra arguments go to cmd/bench, e.g. scripts/bench.sh -scale 4,
# scripts/bench.sh -only queue,storage or scripts/bench.sh -only profile.
# BENCH_FLAGS does the same from make.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:$(go env GOPATH)/bin"

apt_updated=0
apt_install() {
	if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
command -v redis-server >/dev/null || apt_install redis-server
command -v g++ >/dev/null || apt_install g++ # the msl-cpu backend compiles the Metal shader as C++
VERSITYGW_VERSION=v1.8.0
# versitygw built by go install reports "Version: git", so read the module
# version the binary was built from instead.
if ! command -v versitygw >/dev/null || ! go version -m "$(command -v versitygw)" 2>/dev/null | grep -q "versitygw[[:space:]]*${VERSITYGW_VERSION}"; then
	echo "building versitygw ${VERSITYGW_VERSION} (a few minutes the first time)"
	(cd /tmp && go install "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}")
fi
export RMSGRAD_REDIS_SERVER="$(command -v redis-server)"
export RMSGRAD_VERSITYGW="$(command -v versitygw)"
redis-server --version; go version -m "$RMSGRAD_VERSITYGW" | grep -m1 "mod[[:space:]]*github.com/versity/versitygw"

# The end-to-end rows run the worker binary users run: build it from this
# tree even when make build was skipped.
go build -o bin/worker ./cmd/worker
go build -o bin/bench ./cmd/bench
# shellcheck disable=SC2086
exec bin/bench -out report -worker bin/worker ${BENCH_FLAGS:-} "$@"
