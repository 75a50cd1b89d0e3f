"""Prefill after a reused prompt prefix: split, mask-free attention vs transformers' masked `sdpa`.

Replays the act and rehearse prompts of recorded bank runs in run order through the embedded model's
prefill, with the prefix cache on (as generation does: each turn's act prompt extends the previous
one, rehearse prompts share the simulator's system prompt and tools). Each prompt is prefilled in
both modes back to back (alternating which goes first), each mode with a prefix cache of its own, so
both reuse exactly the same tokens. The baseline is the masked path (`split_prefill = False`):
transformers hands the new tokens a (new x cached + new) boolean mask. Reported: seconds and new
(not reused) prompt tokens per second of each, the ratio, and the largest difference in the
next-token logits.

    python benchmarks/prefill_attention.py [--traces DIR] [--runs 8] [--dtype bfloat16]

Without `--traces`, reference runs of the first `--runs` bank train tasks are recorded first
(tokens only, no forward pass).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import anyio
import torch

from envace_mcp.policy import load_policy
from envace_mcp.policy.transformers_backend import PrefixCache
from envace_mcp.traces import TraceStore
from envace_mcp.train.rows import segments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=None, help="recorded runs (default: record bank reference runs)")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16")
    ns = parser.parse_args()
    policy = load_policy(None, dtype=ns.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        folder = ns.traces
        if folder is None:
            from envace_mcp.train.reference import record_reference_traces

            folder = tmp
            anyio.run(lambda: record_reference_traces(policy, "bank", folder, limit=ns.runs, score=False))
        traces = list(TraceStore(folder).read())[: ns.runs]
    prompts = [s.prompt_ids for s in segments(traces, require_reward=False)]
    caches = {True: PrefixCache(policy.prefix_cache.max_tokens), False: PrefixCache(policy.prefix_cache.max_tokens)}
    seconds = {True: 0.0, False: 0.0}
    new_tokens, worst = 0, 0.0
    device = torch.device("cpu")
    with torch.inference_mode():
        policy._prefill(prompts[0][:64], device)  # warm-up
        for i, ids in enumerate(prompts):
            logits = {}
            for split in ((True, False) if i % 2 else (False, True)):
                policy.split_prefill, policy.prefix_cache = split, caches[split]
                reused = policy.prefix_cache.lookup(ids)[0]
                start = time.perf_counter()
                logits[split] = policy._prefill(ids, device)[1]
                seconds[split] += time.perf_counter() - start
            new_tokens += len(ids) - reused
            worst = max(worst, (logits[True] - logits[False]).abs().max().item())
    total = sum(len(ids) for ids in prompts)
    print(f"embedded SmolLM2-135M ({ns.dtype}), {len(traces)} bank runs: {len(prompts)} act + rehearse prompts, "
          f"{total:,} prompt tokens, {new_tokens:,} new after the prefix cache ({1 - new_tokens / total:.0%} reused)")
    for split, name in ((False, "masked sdpa (baseline)"), (True, "split, mask-free      ")):
        print(f"  {name}: {seconds[split]:7.2f} s  {new_tokens / seconds[split]:7.1f} new tok/s")
    print(f"  speed-up: {seconds[False] / seconds[True]:.2f}x; largest next-token logit difference {worst:.4f}")


if __name__ == "__main__":
    main()
