#!/usr/bin/env bash
# The one test command (make test; .ci/run calls it). It installs what the
# tests need when missing (redis-server, Debian's python3-numpy and
# python3-torch, versitygw, minio, g++), checks formatting and vet, runs every
# Go test with the real servers required, runs each fuzz target for a bounded
# time, then runs the demo.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s (%ds in)\n' "$*" "$SECONDS"; }
export PATH="$PATH:$(go env GOPATH)/bin"

apt_updated=0
apt_install() {
	if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

log "dependencies"
command -v redis-server >/dev/null || apt_install redis-server
command -v redis-cli >/dev/null || apt_install redis-tools # redis-cli --cluster create joins the test clusters
command -v g++ >/dev/null || apt_install g++
command -v clang++-19 >/dev/null || apt_install clang-19 # the CUDA kernels through a CUDA front end (cuda.TestKernelsCompile)
# NVRTC, CUDA's own compiler, for cuda.TestKernelsNVRTC: Debian's libnvrtc
# (CUDA 11.8) unpacked into a cache, not installed (no GPU needed).
export RMSGRAD_TEST_NVRTC="$(scripts/nvrtc.sh)"
/usr/bin/python3 -c 'import numpy' 2>/dev/null || apt_install python3-numpy
# The half-precision interop test (cmd/enqueue TestTorchInterop) and the
# Python client's end-to-end tests (cmd/gateway) compare with torch autograd.
/usr/bin/python3 -c 'import torch' 2>/dev/null || apt_install python3-torch
VERSITYGW_VERSION=v1.8.0
# versitygw built by go install reports "Version: git", so read the module
# version the binary was built from instead.
if ! command -v versitygw >/dev/null || ! go version -m "$(command -v versitygw)" 2>/dev/null | grep -q "versitygw[[:space:]]*${VERSITYGW_VERSION}"; then
	echo "building versitygw ${VERSITYGW_VERSION} (a few minutes the first time)"
	(cd /tmp && go install "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}")
fi
# MinIO's own server, the second S3 implementation the storage tests run
# against. Its module has no release tags, so the pin is a pseudo-version;
# the build takes about 6 minutes on two cores, once (cached in GOPATH/bin).
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
if ! command -v minio >/dev/null || ! go version -m "$(command -v minio)" 2>/dev/null | grep -q "minio/minio[[:space:]]*${MINIO_VERSION}"; then
	echo "building minio ${MINIO_VERSION} (about 6 minutes the first time)"
	(cd /tmp && go install "github.com/minio/minio@${MINIO_VERSION}")
fi
export RMSGRAD_REDIS_SERVER="$(command -v redis-server)"
export RMSGRAD_REDIS_CLI="$(command -v redis-cli)"
export RMSGRAD_VERSITYGW="$(command -v versitygw)"
export RMSGRAD_MINIO="$(command -v minio)"
export RMSGRAD_PYTHON=/usr/bin/python3
export RMSGRAD_REQUIRE_SERVERS=1
redis-server --version
echo "versitygw $(go version -m "$RMSGRAD_VERSITYGW" | awk '$1 == "mod" {print $3}')"
echo "minio $(go version -m "$RMSGRAD_MINIO" | awk '$1 == "mod" {print $3}')"
g++ --version | sed -n 1p

log "gofmt and go vet"
unformatted=$(gofmt -l $(git ls-files '*.go'; git ls-files --others --exclude-standard '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted"; exit 1; fi
go vet ./...
# Everything also builds for the Mac workers. Without cgo the metal package
# is its stub; with cgo (make build on a Mac) it is darwinkit's Metal, which
# internal/darwincheck type-checks in go test, worker and bench included.
GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 go vet ./...

log "go test"
go test -count=1 -timeout 60m ${RMSGRAD_TEST_FLAGS:-} ./... 2>&1 | tee /tmp/rmsgrad-test.log | grep -Ev '^(=== RUN|=== PAUSE|=== CONT)' || { echo "go test failed"; exit 1; }

log "go test -race (the packages whose goroutines share a job's buffers, the queue and the HTTP server)"
# Every package passes under -race; these are the ones where a race would
# corrupt a job or lose one, and cost about 3 minutes on 2 cores. The rest:
# CGO_ENABLED=1 go test -race ./... (about 20 minutes, faults/ most of it;
# -race needs cgo, and make builds without it).
CGO_ENABLED=1 go test -race -count=1 -timeout 30m ${RMSGRAD_TEST_FLAGS:-} ./jobs ./gateway ./storage/file ./internal/stackgrow ./cmd/worker 2>&1 | grep -Ev '^(=== RUN|=== PAUSE|=== CONT)' || { echo "go test -race failed"; exit 1; }

log "benchmarks (smoke: each runs a few iterations, so none rots)"
go test -run='^$' -bench='HandlerNoNetwork|CheckFinite' -benchtime=200x ./cmd/bench ./jobs

log "fuzz (bounded)"
# A count, not a duration: with a duration, Go 1.26's fuzz coordinator can
# fail a target with a bare "context deadline exceeded" when the time runs
# out while a worker is mid-input (go.dev/issue/75804, fixed in Go 1.27;
# it failed CI here once on a loaded machine). 200000 inputs are 1-10 s
# per target on the development VM.
FUZZTIME=${FUZZTIME:-200000x}
for spec in $(scripts/fuzz-targets.sh); do
	pkg=${spec%%:*}; target=${spec##*:}
	echo "fuzz $target in $pkg: $FUZZTIME"
	go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" "$pkg"
done

if [ -f cmd/worker/main.go ] && [ "${SKIP_DEMO:-0}" != 1 ]; then
	log "demo"
	make demo
fi
log "all tests passed"
