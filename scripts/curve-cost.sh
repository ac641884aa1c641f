#!/usr/bin/env bash
# Served-request latency over TCP loopback with and without CURVE (docs/SECURITY.md): the
# tokenizer, the controller and 2 workers (built-in tiny model, 1 thread each), started with
# and without the --curve-* flags, alternately, three seeds each; `dpserve bench` no-reuse
# prompts. Usage: scripts/curve-cost.sh [DPSERVE_BINARY] [OUT_DIR]
set -euo pipefail
bin=${1:-target/release/dpserve}
out=${2:-curve-cost}
keys=$out/keys
rm -rf "$keys" && mkdir -p "$keys/allow"
"$bin" keygen "$keys/head" >/dev/null
"$bin" keygen "$keys/worker" >/dev/null
cp "$keys/worker.pub" "$keys/allow/"
export DPSERVE_CONTROLLER_ADDR=tcp://127.0.0.1:17001 DPSERVE_WORKER_ADDR=tcp://127.0.0.1:17002
export DPSERVE_TOKENIZER_ADDR=tcp://127.0.0.1:17003 DPSERVE_PORT=17080 DPSERVE_DP_SIZE=2
export DPSERVE_BUILTIN_SIZE=tiny DPSERVE_NUM_THREADS=1 DPSERVE_MAX_TOTAL_TOKENS=16384
export DPSERVE_LOG=warn
for seed in 1 2 3; do
    for mode in plain curve; do
        head=() worker=()
        if [ "$mode" = curve ]; then
            head=(--curve-secret-key "$keys/head.key" --curve-allow-dir "$keys/allow")
            worker=(--curve-secret-key "$keys/worker.key" --curve-server-key "$keys/head.pub")
        fi
        pids=()
        "$bin" tokenizer "${head[@]}" 2>"$out/tokenizer.log" & pids+=($!)
        "$bin" controller "${head[@]}" 2>"$out/controller.log" & pids+=($!)
        for r in 0 1; do "$bin" worker --rank $r "${worker[@]}" 2>"$out/worker$r.log" & pids+=($!); done
        for _ in $(seq 150); do
            curl -s localhost:17080/get_server_info | grep -q '"live_ranks":\[0,1\]' && break
            sleep 0.2
        done
        "$bin" bench --base-url http://127.0.0.1:17080 --dataset-name no-reuse \
            --gsp-num-groups 25 --gsp-prompts-per-group 8 --gsp-system-prompt-len 64 \
            --gsp-question-len 32 --gsp-output-len 32 --max-concurrency 8 --seed $seed \
            --disable-progress-bar --output-file "$out/$mode-$seed.jsonl" >/dev/null
        kill "${pids[@]}" && wait "${pids[@]}" 2>/dev/null || true
    done
done
python3 - "$out" <<'PY'
import json, sys
for mode in ("plain", "curve"):
    rows = [json.loads(open(f"{sys.argv[1]}/{mode}-{s}.jsonl").readline()) for s in (1, 2, 3)]
    cell = lambda k: ", ".join(f"{r[k]:.2f}" for r in rows)
    print(mode, "| TTFT p50", cell("median_ttft_ms"), "| TTFT p99", cell("p99_ttft_ms"),
          "| E2E p50", cell("median_e2e_latency_ms"), "| E2E p99", cell("p99_e2e_latency_ms"),
          "| req/s", cell("request_throughput"))
PY
