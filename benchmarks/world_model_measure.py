"""Measuring a world model (`envace world-model report` / `fit`'s measurement), before issue 62's change
and now, on the same calls.

- before: each real reply scored by a fresh forward pass over its whole rehearse prompt, which waits for
  the engine's lock until the running decode batch has drained; 8 rehearsals in flight;
- now: scored after the rehearsal's cached prompt, between two decode steps (`Engine.score(reuse_prefix=True)`);
  16 in flight (`worldmodel.measure.IN_FLIGHT`).

Each variant runs in its own process on the same calls (default: the bank and retail validation tasks'
reference calls, replayed on the bundled servers) with the shipped adapter, and prints its wall time, the
mean decode batch and the figures (which must agree: same greedy decoding).

    python benchmarks/world_model_measure.py [--traces DIR] [--calls 32] [--adapter DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _variants import print_each, run_each  # noqa: E402

VARIANTS = ("before", "now")


def suite_calls(folder: str | None) -> str:
    """`folder`, or a new one with the bank and retail validation tasks' reference calls and real replies."""
    if folder is not None:
        return folder
    import anyio

    from envace_mcp.envs import get_suite
    from envace_mcp.lab.suite_calls import record_suite_calls

    folder = tempfile.mkdtemp()
    for name in ("bank", "retail"):
        suite = get_suite(name)
        anyio.run(record_suite_calls, suite, list(suite.split("validation")), folder)
    return folder


def one(args: argparse.Namespace) -> None:
    import envace_mcp.worldmodel.measure as measuring
    from envace_mcp.policy import load_policy
    from envace_mcp.policy.embedded import embedded_adapter
    from envace_mcp.worldmodel.fit import measure, read_calls

    _, calls, _ = read_calls(args.traces)
    calls = calls[: args.calls]
    policy = load_policy(None, adapter=args.adapter or str(embedded_adapter()))
    if args.variant == "before":
        measuring.IN_FLIGHT = 8
        fresh = policy.score
        policy.score = lambda p, c, t=1.0, reuse_prefix=False: fresh(p, c, t)  # the whole prompt, after the batch
    started = time.perf_counter()
    result = measure(policy, calls)
    wall = time.perf_counter() - started
    stats = policy.engine.stats
    overall = result["overall"]
    print(json.dumps({"seconds": round(wall, 1), "calls": len(calls), "rows": round(stats["decode_rows"] / max(1, stats["decode_steps"]), 1),
                      "status": overall["status_accuracy"], "nll": round(overall["nll_per_token"], 4)}))


def main() -> None:
    from envace_mcp.engine.model import machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", help="a trace folder with real calls (default: bank + retail validation calls)")
    parser.add_argument("--calls", type=int, default=32)
    parser.add_argument("--adapter", help="the world model (default: the shipped adapter)")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        return one(args)
    traces = suite_calls(args.traces)
    argv = ["--traces", traces, "--calls", str(args.calls), *(["--adapter", args.adapter] if args.adapter else [])]
    results = run_each(__file__, argv, list(VARIANTS), "measure the world model")
    print(f"{machine()}; the shipped adapter, greedy, as `envace world-model report` measures")
    print_each(results, 7, lambda r, ratio: (
        f"{r['seconds']:7.1f} s for {r['calls']} calls  {ratio} vs before  decode batch {r['rows']:.1f} rows  "
        f"status {r['status']:.3f}  nll/token {r['nll']:.4f}"))

if __name__ == "__main__":
    main()
