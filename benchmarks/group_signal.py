"""Why did online GRPO's groups carry no signal? For each rolled-out group of `envace train grpo --suite`
runs (their `out/traces`): whether its K runs scored alike, and if so how: all passed, all failed the
state check, or all passed the state but failed the same answer check (in simulated mode the answer
quotes what the world model imagined, so a wrong imagined balance fails it whatever the calls were).
Counted per task kind, for each run folder given (e.g. one per arm).

    python benchmarks/group_signal.py grpo-b grpo-c
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from envace_mcp.eval import get_suite
from envace_mcp.traces import TraceStore


def why_uniform(rewards: list) -> str:
    """'signal' when the group's scores differ; otherwise what every run of it had in common."""
    values = {r.value for r in rewards}
    if len(values) > 1:
        return "signal"
    if values == {1.0}:
        return "all passed"
    failed = [tuple(c["name"] for c in r.details.get("checks", []) if not c["passed"]) for r in rewards]
    state = ["state" in f for f in failed]
    if all(state):
        return "all failed the state"
    if not any(state) and len(set(failed)) == 1:
        return "state right, answer check failed in all"
    return "alike, mixed causes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    for run in args.runs:
        groups: dict[str, list] = defaultdict(list)
        suite = None
        for trace in TraceStore(run / "traces").read():
            reward = trace.reward("task")
            if reward is not None and trace.group_id:
                groups[trace.group_id].append(reward)
                suite = suite or get_suite(trace.suite)
        if not groups:
            print(f"{run}: no scored groups")
            continue
        by_kind: dict[str, Counter] = defaultdict(Counter)
        for group_id, rewards in groups.items():
            kind = suite.task(group_id.split(":")[1]).kind
            by_kind[kind][why_uniform(rewards)] += 1
        causes = ["signal", "all passed", "all failed the state", "state right, answer check failed in all",
                  "alike, mixed causes"]
        total = Counter()
        print(f"\n{run}: {len(groups)} groups")
        print(f"| kind | groups | {' | '.join(causes)} |")
        print("|---|---|" + "---|" * len(causes))
        for kind, counts in sorted(by_kind.items()):
            total.update(counts)
            print(f"| {kind} | {sum(counts.values())} | " + " | ".join(str(counts[c]) for c in causes) + " |")
        print(f"| all | {sum(total.values())} | " + " | ".join(str(total[c]) for c in causes) + " |")
        print(f"uniform: {1 - total['signal'] / sum(total.values()):.2f}")


if __name__ == "__main__":
    main()
