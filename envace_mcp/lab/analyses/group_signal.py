"""Why did online GRPO's groups carry no signal? For each rolled-out group of `envace train grpo --suite`
runs (their `out/traces`): whether its K runs scored alike, and if so how: all passed, all failed the
state check, or all passed the state but failed the same answer check (in simulated mode the answer
quotes what the world model imagined, so a wrong imagined balance fails it whatever the calls were).
Counted per task kind, for each run folder given (e.g. one per arm). The last column: how many groups
would carry signal with `GRPOConfig.experimental.call_f1_weight` (`--call-f1-weight`, 0.5 unless given), the task
reward plus the weighted tool-call F1 against the task's reference calls, through the trainer's own
`has_signal` (runs recorded before `call_f1` was, get it computed from the suite's tasks).

    python -m envace_mcp.lab.analyses.group_signal grpo-b grpo-c [--call-f1-weight 0.5]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from envace_mcp.envs import call_f1, get_suite
from envace_mcp.traces import TraceStore
from envace_mcp.train.config import GRPOConfig
from envace_mcp.train.rows import Segment
from envace_mcp.train.sources import has_signal


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


def shaped_signal(runs: list[tuple[str, float, float]], weight: float) -> bool:
    """Whether a group of (run id, task reward, call F1) carries signal under `call_f1_weight` = weight."""
    rows = [Segment(run_id=run, task_id=None, group_id="g", role="act", prompt_ids=[], completion_ids=[1],
                    old_logprobs=None, reward=reward, call_f1=f1) for run, reward, f1 in runs]
    return has_signal(rows, GRPOConfig(advantage="trajectory", experimental={"call_f1_weight": weight}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--call-f1-weight", type=float, default=0.5)
    args = parser.parse_args()
    for run in args.runs:
        groups: dict[str, list] = defaultdict(list)
        shaped: dict[str, list] = defaultdict(list)
        suite = None
        for trace in TraceStore(run / "traces").read():
            reward = trace.reward("task")
            if reward is not None and trace.group_id:
                groups[trace.group_id].append(reward)
                suite = suite or get_suite(trace.suite)
                recorded = trace.reward("call_f1")
                f1 = recorded.value if recorded is not None else call_f1(trace, suite.task(trace.task_id))[0]
                shaped[trace.group_id].append((trace.run_id, reward.value, f1))
        if not groups:
            print(f"{run}: no scored groups")
            continue
        by_kind: dict[str, Counter] = defaultdict(Counter)
        shaped_by_kind: Counter = Counter()  # groups with signal under the shaped reward
        for group_id, rewards in groups.items():
            kind = suite.task(group_id.split(":")[1]).kind
            by_kind[kind][why_uniform(rewards)] += 1
            shaped_by_kind[kind] += shaped_signal(shaped[group_id], args.call_f1_weight)
        causes = ["signal", "all passed", "all failed the state", "state right, answer check failed in all",
                  "alike, mixed causes"]
        total = Counter()
        print(f"\n{run}: {len(groups)} groups; 'shaped': with signal at call_f1_weight {args.call_f1_weight}")
        print(f"| kind | groups | {' | '.join(causes)} | shaped |")
        print("|---|---|" + "---|" * (len(causes) + 1))
        for kind, counts in sorted(by_kind.items()):
            total.update(counts)
            print(f"| {kind} | {sum(counts.values())} | " + " | ".join(str(counts[c]) for c in causes)
                  + f" | {shaped_by_kind[kind]} |")
        n = sum(total.values())
        shaped_total = sum(shaped_by_kind.values())
        print(f"| all | {n} | " + " | ".join(str(total[c]) for c in causes) + f" | {shaped_total} |")
        print(f"uniform: {1 - total['signal'] / n:.2f} on the task reward, {1 - shaped_total / n:.2f} shaped")


if __name__ == "__main__":
    main()
