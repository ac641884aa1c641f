#!/usr/bin/env python3
"""Writes a small agentic trace in the Qwen-Bailian format (one JSON object a line: chat_id,
parent_chat_id (-1 for a session's first turn), timestamp in seconds, input_length,
output_length, type, turn, hash_ids of 16-token blocks) for `dpserve bench --dataset-name
bailian`. Made up, not recorded: its shape is what the peers' users describe of agent traffic.

- Every session starts with one system prompt shared by all, then one of `--tool-sets` tool
  definitions (2 000-8 000 tokens), chosen with Zipf popularity (exponent `--zipf`): a few
  tools prefixes are hot, most are cold.
- A session is a chain of turns. Each turn's prompt is the previous turn's prompt, that turn's
  answer and something new: a tool's output (200-2 000 tokens, sent after 0.5-4 s of tool time)
  or the user's next message (30-300 tokens, after 5-30 s). Answers are short tool calls
  (30-120 tokens) or longer replies (150-500).
- Some turns fan out (`--fanout`): 2-4 sub-agents start together from the whole context, each
  with its own task, for 1-3 turns each; the main chain then continues after the last of them
  with their results.
- Sessions start as a Poisson process at `--session-rate` per second.

A turn's timestamp is its parent's plus the parent's expected service time (0.5 s + 20 ms per
output token) plus the pause; `dpserve bench` sends it only once the parent has finished, after
that same gap. Deterministic for a seed.

    scripts/make-agentic-trace.py --out agentic.jsonl              # 120 sessions, ~900 turns
"""

import argparse
import json
import random

BLOCK = 16


class Blocks:
    """Hands out fresh hash ids; a block is identified by its id alone."""

    def __init__(self):
        self.next = 0

    def fresh(self, tokens):
        n = -(-tokens // BLOCK)
        ids = list(range(self.next, self.next + n))
        self.next += n
        return ids


def zipf_choice(rng, n, s):
    weights = [1.0 / (k + 1) ** s for k in range(n)]
    return rng.choices(range(n), weights=weights)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sessions", type=int, default=120)
    ap.add_argument("--session-rate", type=float, default=0.5)
    ap.add_argument("--tool-sets", type=int, default=12)
    ap.add_argument("--zipf", type=float, default=1.2)
    ap.add_argument("--fanout", type=float, default=0.12)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    blocks = Blocks()
    system = blocks.fresh(1024)
    tools = [blocks.fresh(rng.randint(2000, 8000)) for _ in range(args.tool_sets)]
    turns = []  # (timestamp, line)
    chat_id = [0]

    def emit(parent, ts, ids, out, kind, turn):
        chat_id[0] += 1
        turns.append(
            (
                ts,
                {
                    "chat_id": chat_id[0],
                    "parent_chat_id": parent,
                    "timestamp": round(ts, 3),
                    "input_length": len(ids) * BLOCK,
                    "output_length": out,
                    "type": kind,
                    "turn": turn,
                    "hash_ids": ids,
                },
            )
        )
        return chat_id[0]

    def answer_len(tool_call):
        return rng.randint(30, 120) if tool_call else rng.randint(150, 500)

    def service(out):
        return 0.5 + 0.02 * out

    def chain(parent, ts, ids, out, n_turns, turn, kind, allow_fanout):
        """Turns after (parent, ids, out) at ts; returns the last (id, ts, ids, out, turn)."""
        for _ in range(n_turns):
            tool = rng.random() < 0.7
            if tool:
                new, pause, kind = rng.randint(200, 2000), rng.uniform(0.5, 4.0), "tool"
            else:
                new, pause, kind = rng.randint(30, 300), rng.uniform(5.0, 30.0), "text"
            ids = ids + blocks.fresh(out) + blocks.fresh(new)
            ts = ts + service(out) + pause
            out = answer_len(rng.random() < 0.6)
            turn += 1
            parent = emit(parent, ts, ids, out, kind, turn)
            if allow_fanout and rng.random() < args.fanout:
                last = None
                base_ids, base_out, base_ts = ids, out, ts + service(out) + 0.2
                for _ in range(rng.randint(2, 4)):
                    task = base_ids + blocks.fresh(base_out) + blocks.fresh(rng.randint(100, 300))
                    sub_out = answer_len(True)
                    sub = emit(parent, base_ts, task, sub_out, "subagent", turn + 1)
                    end = chain(sub, base_ts, task, sub_out, rng.randint(0, 2), turn + 1,
                                "subagent", False)
                    if last is None or end[1] > last[1]:
                        last = end
                # The main chain goes on after the last sub-agent, with every result.
                parent, ts = last[0], last[1]
                ids = base_ids + blocks.fresh(base_out) + blocks.fresh(rng.randint(600, 2400))
                ts = ts + service(last[3]) + 0.2
                out = answer_len(rng.random() < 0.6)
                turn += 1
                parent = emit(parent, ts, ids, out, "tool", turn)
        return parent, ts, ids, out, turn

    start = 0.0
    for _ in range(args.sessions):
        start += rng.expovariate(args.session_rate)
        tool_set = tools[zipf_choice(rng, args.tool_sets, args.zipf)]
        ids = system + tool_set + blocks.fresh(rng.randint(30, 300))
        out = answer_len(rng.random() < 0.6)
        root = emit(-1, start, ids, out, "text", 1)
        chain(root, start, ids, out, rng.randint(2, 12), 1, "text", True)

    turns.sort(key=lambda t: (t[0], t[1]["chat_id"]))
    # A child is never before its parent: sorted by time, ties by id (a parent's id is lower).
    with open(args.out, "w") as f:
        for _, line in turns:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    n = len(turns)
    span = turns[-1][0] - turns[0][0]
    mean_in = sum(t[1]["input_length"] for t in turns) / n
    print(f"wrote {args.out}: {n} turns in {args.sessions} sessions over {span:.0f} s "
          f"({(n - 1) / span:.2f} req/s), prompts {mean_in:.0f} tokens on average")


if __name__ == "__main__":
    main()
