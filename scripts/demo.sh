#!/usr/bin/env bash
# The zero-setup demo (make demo): a dev worker (embedded Redis-protocol
# server, local-disk store, CPU backend unless BACKEND is set) and a few
# hundred synthetic jobs of mixed shapes and dtypes, each checked against
# the float64 oracle in its output dtype, then a graceful SIGTERM of the
# worker, which must exit 0.
# Environment: COUNT (jobs), SHAPES (comma-separated ROWSxDIM or AxBx..xDIM),
# DTYPES (comma-separated f32|bf16|f16, or x/w/dy per job as bf16/f32/bf16),
# BACKEND (cpu|auto|metal|cuda). Needs nothing but bash and the two binaries:
# the worker takes free ports itself and announces them in its dev
# directory's dev.json, which enqueue reads (--dev-dir).
set -euo pipefail
cd "$(dirname "$0")/.."

COUNT=${COUNT:-300}
SHAPES=${SHAPES:-8x1024,64x4096,1x257,7x5120,32x768,2x32,4x16x512}
DTYPES=${DTYPES:-f32,bf16,f16,bf16/f32/bf16,f16/bf16/f32}
BACKEND=${BACKEND:-cpu}
dir=$(mktemp -d "${TMPDIR:-/tmp}/rmsgrad-demo.XXXXXX")
data="$dir/data"

bin/worker --dev --dev-redis 127.0.0.1:0 --dev-dir "$data" --backend "$BACKEND" \
	--http 127.0.0.1:0 >"$dir/worker.log" 2>&1 &
worker=$!
cleanup() { kill "$worker" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "demo: $*"; echo "--- worker log (tail)"; tail -n 40 "$dir/worker.log"; exit 1; }

# dev.json appears once the worker serves jobs.
for i in $(seq 300); do
	[ -s "$data/dev.json" ] && break
	kill -0 "$worker" 2>/dev/null || fail "worker exited early"
	[ "$i" = 300 ] && fail "worker not ready after 30s"
	sleep 0.1
done
echo "dev worker pid $worker, backend $BACKEND: $(tr -d '\n ' <"$data/dev.json")"

status=0
bin/enqueue synth --dev-dir "$data" --count "$COUNT" --shape "$SHAPES" --dtype "$DTYPES" --wait || status=$?

kill -TERM "$worker"
wstatus=0
wait "$worker" || wstatus=$?
echo "worker exited with status $wstatus after SIGTERM"
grep -E '"msg":"(worker (started|stopped))' "$dir/worker.log" | head -5 || true
[ "$status" = 0 ] || fail "enqueue synth exited $status"
[ "$wstatus" = 0 ] || fail "worker exited $wstatus after SIGTERM (want 0)"
[ ! -e "$data/dev.json" ] || fail "the worker left $data/dev.json behind after SIGTERM"
