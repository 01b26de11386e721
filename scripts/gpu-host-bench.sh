#!/usr/bin/env bash
# make bench on a host that has no Go, no apt and no network (a GPU host):
# pack here, run there.
#
#   scripts/gpu-host-bench.sh pack            # here: .devcarry/c.tar.xz (about 27 MB):
#                                             # bin/{worker,bench} (CGO_ENABLED=0, stripped),
#                                             # versitygw (pinned, CGO_ENABLED=0), redis-server
#                                             # and redis-cli with their shared libraries and loader
#   scripts/gpu-host-bench.sh run OUT [bench flags]
#                                             # there: unpack to /tmp/d, start bin/bench with
#                                             # its servers from the pack; report in OUT
#
# bin/worker picks its backend itself (auto: CUDA on an NVIDIA host); add
# -inproc-backend cuda for the in-process profile. The wrappers
# /tmp/d/bin/worker-procsN run the worker with procs N (GOMAXPROCS),
# /tmp/d/bin/worker-concN with concurrency N and
# /tmp/d/bin/worker-fetchN with N fetch loops, for -worker /
# -baseline-worker. .devcarry/ must be in .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
pack)
	VERSITYGW_VERSION=v1.8.0
	d=$(mktemp -d)
	mkdir -p "$d/bin" "$d/lib" .devcarry
	CGO_ENABLED=0 go build -ldflags "-s -w" -o "$d/bin/" ./cmd/worker ./cmd/bench
	GOBIN="$d/bin" CGO_ENABLED=0 go install -ldflags "-s -w" "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}"
	rs=$(command -v redis-server)
	rc=$(command -v redis-cli)
	cp -L "$rs" "$d/bin/redis-server"
	cp -L "$rc" "$d/bin/redis-cli"
	# The host's glibc may be older than ours: run redis-server and
	# redis-cli (bench -only cluster joins a Redis Cluster with it) through
	# our own loader with our libraries.
	for l in $(ldd "$rs" "$rc" | awk '/=>/ {print $3} /ld-linux/ {print $1}' | sort -u); do cp -L "$l" "$d/lib/"; done
	for p in redis-server redis-cli; do
		w=redis-wrap
		[ "$p" = redis-cli ] && w=redis-cli-wrap
		cat >"$d/bin/$w" <<W
#!/bin/sh
d=\$(dirname "\$(readlink -f "\$0")")
exec "\$d/../lib/ld-linux-x86-64.so.2" --library-path "\$d/../lib" "\$d/$p" "\$@"
W
	done
	for n in 2 4 8 16; do printf '#!/bin/sh\nexec /tmp/d/bin/worker --procs %s "$@"\n' "$n" >"$d/bin/worker-procs$n"; done
	for n in 1 2 4 8 16; do printf '#!/bin/sh\nexec /tmp/d/bin/worker --fetchers %s "$@"\n' "$n" >"$d/bin/worker-fetch$n"; done
	for n in 32 128 256; do printf '#!/bin/sh\nexec /tmp/d/bin/worker --concurrency %s "$@"\n' "$n" >"$d/bin/worker-conc$n"; done
	chmod +x "$d/bin/"*
	tar -C "$d" -cJf .devcarry/c.tar.xz bin lib
	rm -rf "$d"
	ls -la .devcarry/c.tar.xz
	;;
run)
	out=${2:?usage: $0 run OUT [bench flags]}
	shift 2
	mkdir -p /tmp/d "$out"
	tar -C /tmp/d -xJf .devcarry/c.tar.xz
	export RMSGRAD_VERSITYGW=/tmp/d/bin/versitygw RMSGRAD_REDIS_SERVER=/tmp/d/bin/redis-wrap RMSGRAD_REDIS_CLI=/tmp/d/bin/redis-cli-wrap
	nproc
	nvidia-smi -L 2>/dev/null || true
	/tmp/d/bin/bench -out "$out" -worker /tmp/d/bin/worker "$@"
	;;
*)
	sed -n '2,17p' "$0"
	exit 2
	;;
esac
