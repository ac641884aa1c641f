#!/usr/bin/env bash
# Regenerates docs/img/request.svg and docs/img/routing.svg (and their Chrome trace JSON) from a
# short run on the built-in model: two ranks under `dpserve up`, a third rank that joins, takes
# traffic and leaves, a generated-shared-prefix workload with routing keys, and one traced
# request. About 4 seconds on a 2-core machine. Run from the repository root after
# `cargo build --release` (or set DPSERVE to another binary, PORT to another port).
set -euo pipefail
BIN=${DPSERVE:-target/release/dpserve}
PORT=${PORT:-30000}
OUT=${OUT:-docs/img}
WORK=$(mktemp -d /tmp/dps-pictures.XXXXXX)
TRACES=$WORK/traces
URL=http://127.0.0.1:$PORT
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT

"$BIN" up --port "$PORT" --dp-size 2 --builtin-size tiny --runtime-dir "$WORK/run" \
    --trace-dir "$TRACES" --trace-file "$TRACES/route.jsonl" >"$WORK/up.log" 2>&1 &
until grep -q "dpserve is ready" "$WORK/up.log"; do sleep 0.5; done

bench() {
    "$BIN" bench --base-url "$URL" --gsp-num-groups 6 --gsp-prompts-per-group 8 \
        --gsp-system-prompt-len 96 --gsp-question-len 16 --gsp-output-len 8 \
        --gsp-send-routing-key --num-prompts 48 --max-concurrency 8 --seed "$1" >/dev/null
}
bench 1
# A third rank joins: its keys move to it (and only its keys).
"$BIN" worker --rank 2 --builtin-size tiny --worker-addr "ipc://$WORK/run/worker.sock" \
    --tokenizer-addr "ipc://$WORK/run/tokenizer.sock" --trace-dir "$TRACES" \
    >"$WORK/worker2.log" 2>&1 &
RANK2=$!
until curl -s "$URL/metrics" | grep -q "^dpserve:live_ranks 3"; do sleep 0.5; done
bench 2
# ... and leaves: its keys go back.
kill "$RANK2"
wait "$RANK2" || true
until curl -s "$URL/metrics" | grep -q "^dpserve:live_ranks 2"; do sleep 0.5; done
bench 3
curl -s "$URL/generate" -H 'x-smg-routing-key: tenant-1' \
    -d '{"rid": "demo-1", "text": "once upon a time there was a little robot", "stream": true,
         "sampling_params": {"max_new_tokens": 12}}' >/dev/null

"$BIN" trace "$TRACES" --rid demo-1 --svg "$OUT/request.svg" --chrome "$OUT/request.json"
"$BIN" trace "$TRACES/route.jsonl" --svg "$OUT/routing.svg" --chrome "$OUT/routing.json"
