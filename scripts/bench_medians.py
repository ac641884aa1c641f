#!/usr/bin/env python3
"""Every run and the per-method medians of several `dpserve bench --launch` comparisons.

    scripts/bench_medians.py bench-results/run1 bench-results/run2 bench-results/run3

Reads each directory's compare.json (one `--compare` invocation each, the same workload) and
prints two Markdown tables: the medians per method (goodput, p50/p90 TTFT, p99 ITL, the server's
cache hit rate next to the workload's ceilings, prompt-token load max/mean, refusals), then
every run. Standard library only.
"""

import json
import statistics
import sys
from pathlib import Path

COLUMNS = [
    # (header, key in the result line, format)
    ("goodput req/s", "goodput", "{:.2f}"),
    ("good %", "goodput_share", "pct"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("p50 TTFT ms", "median_ttft_ms", "{:.0f}"),
    ("p90 TTFT ms", "p90_ttft_ms", "{:.0f}"),
    ("p99 TTFT ms", "p99_ttft_ms", "{:.0f}"),
    ("p50 ITL ms", "median_itl_ms", "{:.1f}"),
    ("p99 ITL ms", "p99_itl_ms", "{:.1f}"),
    ("p99 E2E ms", "p99_e2e_latency_ms", "{:.0f}"),
    ("cache hit", "cache_hit_rate", "pct"),
    ("load max/mean", "prompt_load_max_over_mean", "{:.2f}"),
    ("refused", "refused", "{:.0f}"),
]


def fmt(value, how):
    if value is None:
        return "?"
    if how == "pct":
        return f"{value * 100:.1f}%"
    return how.format(value)


def main(dirs):
    runs = []
    for d in dirs:
        compare = json.loads((Path(d) / "compare.json").read_text())
        runs.append((d, compare))
    methods = []
    by_method = {}
    ceilings = set()
    for _, compare in runs:
        for m in compare["methods"]:
            name = m["method"]
            if name not in by_method:
                methods.append(name)
                by_method[name] = []
            if m["status"] == "ok":
                r = m["result"]
                by_method[name].append(r)
                ceilings.add(
                    (r.get("cache_hit_ceiling_unlimited"), r.get("cache_hit_ceiling_pooled_lru"))
                )
    heads = ["method", "runs"] + [c[0] for c in COLUMNS]
    print("| " + " | ".join(heads) + " |")
    print("| --- | ---: |" + " ---: |" * len(COLUMNS))
    for name in methods:
        rs = by_method[name]
        cells = [name, str(len(rs))]
        for _, key, how in COLUMNS:
            vals = [r[key] for r in rs if r.get(key) is not None]
            cells.append(fmt(statistics.median(vals), how) if vals else "?")
        print("| " + " | ".join(cells) + " |")
    for unlimited, pooled in sorted(ceilings, key=str):
        print(
            f"\nceilings: unlimited cache {fmt(unlimited, 'pct')}, "
            f"one LRU pool of every rank's KV {fmt(pooled, 'pct')}"
        )
    print("\nEvery run:\n")
    print("| run | method | " + " | ".join(c[0] for c in COLUMNS) + " |")
    print("| --- | --- |" + " ---: |" * len(COLUMNS))
    for d, compare in runs:
        for m in compare["methods"]:
            if m["status"] != "ok":
                print(f"| {Path(d).name} | {m['method']} | skipped: {m.get('reason', '')} |")
                continue
            r = m["result"]
            cells = [fmt(r.get(key), how) for _, key, how in COLUMNS]
            print(f"| {Path(d).name} | {m['method']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
