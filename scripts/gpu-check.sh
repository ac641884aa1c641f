#!/usr/bin/env bash
# The checks of `--device cuda` on a machine with an NVIDIA GPU, in under 8 minutes, ending in one
# summary. The GPU machine reaches no package registry and may have no Rust, so the work is split:
#
#   scripts/gpu-check.sh prepare   on the build machine (this repo, ../shared beside it): builds
#                                  dpserve and the two test executables that drive a GPU (the dev
#                                  profile, optimised: what the tests use, so a warm tree is quick),
#                                  and gathers them with the stories260k model into target/gpu-check
#                                  (checked: glibc symbols no newer than 2.35, under 60 MiB in all).
#   scripts/gpu-check.sh run       on the GPU machine, from the repo root, target/gpu-check carried:
#                                  finds the CUDA libraries (probed, not assumed), then runs
#                                    1. the GPU pass against the CPU pass (model/tests/cuda_parity.rs:
#                                       f32 logits within 1e-3, bf16/f16 within their rounding) and
#                                       against transformers on the fixtures of
#                                       model/tests/fixtures/hf (f32, within 1e-4),
#                                    2. `dpserve up --device cuda` serving stories260k: the golden
#                                       greedy continuation on two ranks sharing GPU 0, concurrent
#                                       requests (tests/e2e_cuda.rs),
#                                    3. a short `dpserve bench --launch` of the built-in model on
#                                       GPU 0 and, as the baseline of the same run, on the CPU
#                                       (GPU_CHECK_BUILTIN_SIZE=tiny for a dry run on the emulator).
#
# Exit status 0 when every check passed. Every step has its own timeout.
set -u -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/target/gpu-check"

prepare() {
    set -e
    cd "$root"
    local shared="$root/../shared/models/stories260k"
    [ -e "$shared/model.safetensors" ] || { echo "gpu-check: $shared not found" >&2; exit 1; }
    cargo build --locked --bin dpserve
    rm -rf "$out" && mkdir -p "$out/bin" "$out/shared/models"
    cp target/debug/dpserve "$out/bin/"
    # The test executables, by the paths cargo reports.
    local exe
    for spec in "-p model --test cuda_parity" "--test e2e_cuda"; do
        # shellcheck disable=SC2086
        exe=$(cargo test --locked $spec --no-run --message-format=json 2>/dev/null \
            | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -1)
        [ -n "$exe" ] || { echo "gpu-check: no executable for $spec" >&2; exit 1; }
        cp "$exe" "$out/bin/$(basename "$exe" | sed 's/-[0-9a-f]*$//')"
    done
    strip "$out"/bin/*
    cp -r "$shared" "$out/shared/models/"
    local newest
    newest=$(objdump -T "$out"/bin/* | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
    echo "gpu-check: newest glibc symbol: $newest"
    if [ "$(printf '%s\nGLIBC_2.35\n' "$newest" | sort -V | tail -1)" != GLIBC_2.35 ]; then
        echo "gpu-check: $newest is newer than the GPU machine's glibc 2.35" >&2
        exit 1
    fi
    local bytes
    bytes=$(du -sb "$out" | cut -f1)
    echo "gpu-check: $out holds $((bytes >> 20)) MiB"
    [ "$bytes" -lt $((60 << 20)) ] || { echo "gpu-check: over 60 MiB" >&2; exit 1; }
    ls -la "$out/bin"
}

# The first directory holding $1 among the usual places (LD_LIBRARY_PATH, the loader cache, CUDA
# toolkits, pip's nvidia wheels, conda).
find_lib() {
    local name=$1 dir
    local IFS=:
    for dir in ${LD_LIBRARY_PATH:-}; do
        if [ -n "$dir" ] && [ -e "$dir/$name" ]; then echo "$dir"; return; fi
    done
    unset IFS
    dir=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }')
    if [ -n "$dir" ]; then dirname "$dir"; return; fi
    for dir in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/*/lib \
        /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
        /opt/conda/lib /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib \
        /usr/lib/python3/dist-packages/nvidia/cu13/lib /usr/local/lib/python3*/site-packages/nvidia/*/lib \
        "$HOME"/.local/lib/python3*/site-packages/nvidia/*/lib; do
        if [ -e "$dir/$name" ]; then echo "$dir"; return; fi
    done
    find / -xdev -name "$name" -not -path '*/proc/*' 2>/dev/null | head -1 | xargs -r dirname
}

run() {
    cd "$root"
    [ -x "$out/bin/dpserve" ] || { echo "gpu-check: run 'scripts/gpu-check.sh prepare' first" >&2; exit 1; }
    local started=$SECONDS libs="" lib dir
    echo "== GPU"
    nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version --format=csv 2>&1 | head -9
    echo "== CUDA libraries"
    for lib in libcuda.so.1 libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13; do
        dir=$(find_lib "$lib")
        echo "$lib: ${dir:-NOT FOUND}"
        if [ -n "$dir" ] && [[ ":$libs:" != *":$dir:"* ]]; then libs="$libs${libs:+:}$dir"; fi
    done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # The tests find the binary and the model here, and leave the CPU emulator of the driver aside.
    export DPSERVE_TEST_BIN="$out/bin/dpserve" DPSERVE_TEST_SHARED="$out/shared" DPSERVE_CUDA_EMU=0
    # The Hugging Face parity fixtures, from this (tracked) checkout.
    export DPSERVE_TEST_HF_FIXTURES="$root/model/tests/fixtures/hf"
    local -a summary=()
    local status=0 log
    check() {
        local name=$1 limit=$2
        shift 2
        log="$out/$name.log"
        echo "== $name (limit ${limit}s): $*"
        if timeout "$limit" "$@" >"$log" 2>&1; then
            summary+=("PASS $name")
        else
            summary+=("FAIL $name (exit $?, see $log)")
            status=1
        fi
        tail -40 "$log"
    }
    check parity 120 "$out/bin/cuda_parity" --test-threads 1 --nocapture
    check serving 180 "$out/bin/e2e_cuda" --test-threads 1 --nocapture
    local bench_args=(bench --launch --num-prompts 64 --max-concurrency 16 --gsp-num-groups 4
        --gsp-prompts-per-group 16 --gsp-system-prompt-len 256 --gsp-question-len 64
        --gsp-output-len 64 --disable-progress-bar --compare round_robin --dp-size 1
        --builtin-size "${GPU_CHECK_BUILTIN_SIZE:-base}")
    check bench-cuda 90 "$out/bin/dpserve" "${bench_args[@]}" --output-dir "$out/bench-cuda" \
        --up-arg=--device --up-arg=cuda:0
    check bench-cpu 90 "$out/bin/dpserve" "${bench_args[@]}" --output-dir "$out/bench-cpu"
    echo "== summary ($((SECONDS - started)) s)"
    printf '%s\n' "${summary[@]}"
    grep -ho "GPU: .*\|[A-Za-z0-9]*: worst logit.*" "$out/parity.log" | sort -u | sed 's/^/parity: /'
    grep -h "golden\|ranks" "$out/serving.log" | grep -v "^test " | sed 's/^/serving: /' | head -8
    for b in cuda cpu; do
        grep -hi "request throughput\|output token throughput\|mean ttft" "$out/bench-$b.log" \
            | sed "s/^/bench $b: /" | head -4
    done
    return $status
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *)
        echo "usage: scripts/gpu-check.sh prepare|run" >&2
        exit 2
        ;;
esac
