"""Tokens one SFT epoch pushes through the model, today's format and packing vs the new ones.

Records the reference runs of the bundled suites' train splits (bank 264 + retail 240; token ids only,
no forward pass) in two formats, with the embedded model's tokenizer, and counts the packed tokens of
one epoch of `envace train sft` rows:
- today's: JSON tool schemas, EnvACE's simulator rehearse prompt, passes of 4 rows in prompt order
  sharing their common prompt prefix (what `collate(share_prefix=True)` packed before the prefix tree);
- new: compact tool text, inline rehearsals, prefix-tree passes (`rows.collate`) of at most
  `--micro-tokens` packed tokens (`rows.micro_batches`): a run's turns nest in the turns that repeat them.
Compute (forward + backward) follows packed tokens; target tokens (what the loss reads) are printed too.

    python benchmarks/sft_tokens.py [--limit N] [--micro-tokens 8192]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import anyio

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def packed_before(rows, per_pass: int = 4) -> int:
    """Tokens of the old layout: passes of `per_pass` rows in prompt order, their common prefix once."""
    from envace_mcp.train.rows import prefix_order, shared_prefix_length

    order = prefix_order(rows)
    total = 0
    for start in range(0, len(order), per_pass):
        part = [rows[i] for i in order[start:start + per_pass]]
        cut = shared_prefix_length(part)
        total += cut + sum(len(r.prompt_ids) + len(r.completion_ids) - cut for r in part)
    return total


def packed_now(rows, micro_tokens: int) -> tuple[int, int]:
    from envace_mcp.train.rows import collate, micro_batches, prefix_order

    ordered = [rows[i] for i in prefix_order(rows)]
    passes = micro_batches(ordered, 32, micro_tokens)
    return sum(collate([ordered[i] for i in p], share_prefix=True).input_ids.numel() for p in passes), len(passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="the first N train tasks of each suite")
    parser.add_argument("--micro-tokens", type=int, default=8192)
    ns = parser.parse_args()

    from envace_mcp.policy import load_policy
    from envace_mcp.traces import TraceStore
    from envace_mcp.lab.reference import record_reference_traces
    from envace_mcp.train.sft import sft_rows, target_encoding

    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, formats in (("today", {"tool_format": "json", "rehearse_format": "simulator"}),
                               ("new", {"tool_format": "compact", "rehearse_format": "inline"})):
            policy = load_policy(None, adapter=None, **formats)
            encode, end = target_encoding(policy.tokenizer)
            runs = []
            for suite in ("bank", "retail"):
                out = Path(tmp) / label / suite
                anyio.run(lambda: record_reference_traces(policy, suite, out, limit=ns.limit, score=False))
                runs += list(TraceStore(out).read())
            rows = sft_rows(runs, encode, end)
            targets = sum(len(r.completion_ids) for r in rows)
            unshared = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
            counts[label] = (len(runs), len(rows), targets, unshared, packed_before(rows), *packed_now(rows, ns.micro_tokens))
    print("embedded SmolLM2-135M tokenizer; reference runs of bank + retail train splits; one SFT epoch")
    print(f"{'format':6} {'runs':>5} {'rows':>5} {'targets':>9} {'unpacked':>10} {'4-row prefix':>13} "
          f"{'prefix tree':>12} {'passes':>6}")
    for label, (runs, rows, targets, unshared, before, now, passes) in counts.items():
        print(f"{label:6} {runs:5} {rows:5} {targets:9,} {unshared:10,} {before:13,} {now:12,} {passes:6}")
    today, new = counts["today"], counts["new"]
    print(f"new (compact + inline, prefix tree) vs today (JSON + simulator, 4-row prefix): "
          f"{new[5] / today[4]:.2f}x packed tokens")


if __name__ == "__main__":
    main()
