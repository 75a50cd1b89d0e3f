"""Seconds and peak memory of one GRPO update (the learner's optimizer step over a step's segments) on
the embedded SmolLM2 with LoRA, with checkpointing recomputing the attention kernel (before issue 53)
or keeping its outputs (today), and today's in passes of 8,192 packed tokens instead of 4,096
(`performance.micro_tokens`: fewer passes, so the prompt prefix they share runs fewer times, for more
activation memory), and today's with glibc's own mmap threshold or 4, 8, 16 or 32 MB instead of 1 MB
(`performance.mmap_threshold_mb`: fewer page faults, a higher peak).

    python benchmarks/grpo_update.py [--traces DIR] [--runs 4] [--steps 2] [--variants NAME ...]

The segments are the act and rehearse turns of `--runs` reference runs (`envace lab reference DIR
--no-logprobs`; recorded here on the first bank train tasks when no folder is given), in groups of 4
runs with rewards 1, 0, 1, 0, so every advantage is non-zero and every segment goes through the model
(4 runs: 16 segments, 29k tokens as single rows); the learner's defaults otherwise (bf16 autocast
where native, prefix-tree passes of 4,096 tokens, glibc's 1 MB mmap threshold). Each variant runs in
a fresh process (its own peak RSS), `--steps` updates on the same groups; seconds are the mean of the
updates after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VARIANTS = {  # name: (checkpointing keeps the attention kernel's outputs, performance.micro_tokens, .mmap_threshold_mb)
    "attention recomputed (before)": (False, 4096, 1.0),
    "attention kept (today)": (True, 4096, 1.0),
    "attention kept, passes of 8,192": (True, 8192, 1.0),
    "attention kept, 4 MB threshold": (True, 4096, 4.0),
    "attention kept, 8 MB threshold": (True, 4096, 8.0),
    "attention kept, 16 MB threshold": (True, 4096, 16.0),
    "attention kept, 32 MB threshold": (True, 4096, 32.0),
    "attention kept, glibc's own threshold": (True, 4096, None),
}


def run_variant(folder: str, runs: int, steps: int, name: str) -> dict:
    from _variants import recompute_attention

    from envace_mcp.traces import TraceStore
    from envace_mcp.train.config import GRPOConfig
    from envace_mcp.train.learner import GRPOLearner
    from envace_mcp.train.rows import segments

    keep, micro_tokens, threshold = VARIANTS[name]
    if not keep:
        recompute_attention()
    traces = sorted(TraceStore(folder).read(), key=lambda t: t.run_id)[:runs]
    rows = segments(traces, require_reward=False)
    by_run: dict[str, list] = {}
    for row in rows:
        by_run.setdefault(row.run_id, []).append(row)
    groups = []
    for i, run in enumerate(by_run.values()):
        if i % 4 == 0:
            groups.append([])
        for row in run:
            row.reward, row.group_id = float(i % 2 == 0), f"g{i // 4}"
        groups[-1] += run
    learner = GRPOLearner(GRPOConfig(performance={"skip_zero_advantage": False, "micro_tokens": micro_tokens,
                                                   "mmap_threshold_mb": threshold}))
    times, record = [], {}
    for _ in range(steps):
        start = time.perf_counter()
        record = learner.update(groups)
        times.append(time.perf_counter() - start)
    steady = times[1:] or times
    return {"seconds": sum(steady) / len(steady), "first": times[0], "segments": len(rows),
            "tokens": sum(len(r.completion_ids) for r in rows), "loss": record.get("loss", 0.0),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description="Seconds and peak memory of one GRPO update, attention kept vs recomputed.")
    parser.add_argument("--traces", default=None)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), metavar="NAME")
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.traces, args.runs, args.steps, args.variant)))
        return
    from _variants import print_each, reference_traces, run_each

    from envace_mcp.engine.model import machine

    folder = reference_traces(args.traces, args.runs)
    print(f"{machine()}; LoRA r 16, checkpointing, the learner's defaults otherwise")
    argv = ["--traces", folder, "--runs", str(args.runs), "--steps", str(args.steps)]
    results = run_each(__file__, argv, args.variants, "GRPO update variants")
    print_each(results, 38, lambda r, ratio: (
        f"{r['seconds']:6.1f} s/update (first {r['first']:5.1f})  {ratio}  {r['segments']} segments, "
        f"{r['tokens']} completion tokens  peak {r['peak_mb']:6.0f} MB  loss {r['loss']:.5f}"))

if __name__ == "__main__":
    main()
