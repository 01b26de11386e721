#!/usr/bin/env bash
# The zero-setup demo (make demo): a dev worker (embedded Redis-protocol
# server, local-disk store, CPU backend unless BACKEND is set) and a few
# hundred synthetic jobs of mixed shapes, each checked against the float64
# oracle, then a graceful SIGTERM of the worker.
set -euo pipefail
cd "$(dirname "$0")/.."

COUNT=${COUNT:-300}
SHAPES=${SHAPES:-8x1024,64x4096,1x257,7x5120,32x768,2x32,4x16x512}
BACKEND=${BACKEND:-cpu}
dir=$(mktemp -d "${TMPDIR:-/tmp}/rmsgrad-demo.XXXXXX")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 6390)
http=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 9090)

bin/worker --dev --dev-redis "127.0.0.1:$port" --dev-dir "$dir/data" --backend "$BACKEND" \
	--http "127.0.0.1:$http" >"$dir/worker.log" 2>&1 &
worker=$!
cleanup() { kill "$worker" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

for _ in $(seq 100); do
	curl -fsS "http://127.0.0.1:$http/readyz" >/dev/null 2>&1 && break
	kill -0 "$worker" 2>/dev/null || { echo "worker exited early:"; cat "$dir/worker.log"; exit 1; }
	sleep 0.1
done
echo "dev worker pid $worker: redis 127.0.0.1:$port, store $dir/data, backend $BACKEND, metrics http://127.0.0.1:$http/metrics"

status=0
bin/enqueue synth --redis "127.0.0.1:$port" --root "$dir/data" --count "$COUNT" --shape "$SHAPES" --wait || status=$?

kill -TERM "$worker"
wstatus=0
wait "$worker" || wstatus=$?
echo "worker exited with status $wstatus after SIGTERM"
grep -E '"msg":"(backend|worker (started|stopped))' "$dir/worker.log" | head -5 || true
exit $(( status != 0 || wstatus != 0 ))
