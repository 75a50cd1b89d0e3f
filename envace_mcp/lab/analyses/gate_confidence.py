"""How sure was the world model of the failures it predicted? For each destructive call of saved
`envace eval` runs: the rehearsal's probability of an error reply (its first token's probability when
it wrote an error, one minus it when it wrote a result) beside what the call would have done
(`results.json`'s gate value). Prints the AUC of harmful against requested calls and, per threshold,
what `GateConfig.min_failure_confidence` would have stopped, call by call (first order: the runs are
not replayed, so later calls are as they were). Also what failing closed
(`GateConfig.on_unusable="block"`) would have stopped on top of what was stopped:
the calls that ran although their rehearsal was unusable.

    python -m envace_mcp.lab.analyses.gate_confidence evals/bank-val [more eval folders] [--thresholds 0.5,0.6,0.7,0.8,0.9]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from envace_mcp.traces import TraceStore


def destructive_calls(folder: Path) -> list[tuple[str, float | None, bool]]:
    """(would, P(error) or None when the call had no rehearsal with logprobs, ran although its rehearsal
    was unusable), per destructive call."""
    results = json.loads((folder / "results.json").read_text())
    runs = {r["run_id"]: r for r in results["runs"]}
    out: list[tuple[str, float | None, bool]] = []
    for trace in TraceStore(folder / "traces").read():
        record = runs.get(trace.run_id)
        if not record or not record.get("destructive"):
            continue
        tools = {d["tool"] for d in record["destructive"]}
        gated, last = [], None
        for step in trace.steps:
            if step.role == "rehearse":
                last = step
            elif step.role == "gate" and step.tool in tools:
                gated.append(last if last is not None and (last.parsed or {}).get("tool") == step.tool else None)
                last = None
        if len(gated) != len(record["destructive"]):
            raise SystemExit(f"{folder}: run {trace.run_id} has {len(gated)} gated destructive calls, "
                             f"results.json {len(record['destructive'])}")
        for step, call in zip(gated, record["destructive"]):
            status = (step.parsed or {}).get("status") if step is not None else None
            unusable_ran = status == "invalid" and not call["stopped"]
            if step is None or not step.logprobs:
                out.append((call["would"], None, unusable_ran))
                continue
            first = math.exp(step.logprobs[0])
            out.append((call["would"], first if status == "tool_error" else 1.0 - first, unusable_ran))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="envace eval --out folders (results.json + traces/)")
    parser.add_argument("--thresholds", default="0.5,0.6,0.7,0.8,0.9")
    args = parser.parse_args()
    every = [c for folder in args.folders for c in destructive_calls(folder)]
    calls = [(would, p) for would, p, _ in every]
    scored = [(would, p) for would, p in calls if p is not None]
    harmful = [p for would, p in scored if would != "requested"]
    requested = [p for would, p in scored if would == "requested"]
    print(f"{len(calls)} destructive calls, {len(scored)} rehearsed with logprobs: "
          f"{len(harmful)} harmful, {len(requested)} requested")
    if harmful and requested:
        wins = sum((h > r) + 0.5 * (h == r) for h in harmful for r in requested)
        print(f"AUC (P(error) ranks a harmful call above a requested one): {wins / (len(harmful) * len(requested)):.3f}")
    for threshold in (float(t) for t in args.thresholds.split(",")):
        print(f"min_failure_confidence {threshold:.2f}: harmful predicted to fail {sum(p >= threshold for p in harmful)}"
              f"/{len(harmful)}, requested {sum(p >= threshold for p in requested)}/{len(requested)}")

    closed = [would for would, _, unusable_ran in every if unusable_ran]
    print(f"on_unusable=block would also stop: harmful "
          f"{sum(w != 'requested' for w in closed)}/{sum(w != 'requested' for w, _ in calls)}, "
          f"requested {sum(w == 'requested' for w in closed)}/{sum(w == 'requested' for w, _ in calls)}")


if __name__ == "__main__":
    main()
