#!/usr/bin/env python3
"""A Mooncake-format trace as sessions in the Qwen-Bailian format (`--dataset-name bailian`).

Mooncake's traces (kvcache-ai/Mooncake, FAST25-release/traces) give each request its arrival
time, lengths and 512-token prompt blocks, but not which earlier request it continues. This
reads that from the blocks: a request continues the latest earlier one whose whole prompt (its
full blocks) starts its own, that no other request continues yet, and that came at least
--min-gap-s before it (a turn is sent after the previous answer was read, so two requests that
share a prompt but arrive together are two sessions, not two turns). The rest start sessions.

Out: one JSON line per request, in time order: chat_id (its line number from 1),
parent_chat_id (-1 for a session's first turn), timestamp (seconds), input_length,
output_length, type ("text"), turn (1 for a first turn), hash_ids (16-token blocks: each
512-token block b becomes b*32 .. b*32+31, cut to the prompt's length), so the replay's
`--trace-block-tokens` scales it as it does a Bailian trace.

    scripts/mooncake-to-bailian.py conversation_trace.jsonl > conversation_sessions.jsonl
"""

import argparse
import json
import sys
from collections import defaultdict

MOONCAKE_BLOCK = 512
BAILIAN_BLOCK = 16


def sessions(rows, min_gap_s):
    """Each row's parent index (or None)."""
    by_prompt = defaultdict(list)  # full blocks of a prompt -> rows with that prompt
    continued = set()
    parents = []
    for i, r in enumerate(rows):
        h = r["hash_ids"]
        parent = None
        for n in range(len(h) - 1, 0, -1):
            for j in reversed(by_prompt.get(tuple(h[:n]), ())):
                gap = (r["timestamp"] - rows[j]["timestamp"]) / 1000
                if j not in continued and gap >= min_gap_s:
                    parent = j
                    break
            if parent is not None:
                break
        if parent is not None:
            continued.add(parent)
        parents.append(parent)
        if len(h) > 1:
            by_prompt[tuple(h[:-1])].append(i)
    return parents


def blocks16(r):
    per = MOONCAKE_BLOCK // BAILIAN_BLOCK
    out = [b * per + k for b in r["hash_ids"] for k in range(per)]
    return out[: -(-r["input_length"] // BAILIAN_BLOCK)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a Mooncake-format trace (JSON lines)")
    ap.add_argument("--min-gap-s", type=float, default=2.0,
                    help="least time between a turn and the one it continues (default 2)")
    a = ap.parse_args()
    with open(a.trace) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if any(rows[i]["timestamp"] > rows[i + 1]["timestamp"] for i in range(len(rows) - 1)):
        sys.exit(f"{a.trace}: not sorted by timestamp")
    parents = sessions(rows, a.min_gap_s)
    turns = []
    for i, (r, p) in enumerate(zip(rows, parents)):
        turns.append(1 if p is None else turns[p] + 1)
        print(json.dumps({
            "chat_id": i + 1,
            "parent_chat_id": -1 if p is None else p + 1,
            "timestamp": r["timestamp"] / 1000,
            "input_length": r["input_length"],
            "output_length": r["output_length"],
            "type": "text",
            "turn": turns[-1],
            "hash_ids": blocks16(r),
        }))
    continuing = sum(p is not None for p in parents)
    print(f"{len(rows)} requests: {len(rows) - continuing} sessions, {continuing} later turns",
          file=sys.stderr)


if __name__ == "__main__":
    main()
