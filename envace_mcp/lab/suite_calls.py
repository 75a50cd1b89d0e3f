"""Real calls of a task suite without a model: each task's reference calls, run in order on its own
episode of the suite's real server, recorded as traces with the catalog attached — world-model data for
servers the shipped adapter never saw (τ²-airline), as a user's recorded calls would be.

    python -m envace_mcp.lab.suite_calls --suite tau2-airline --split test --out runs/airline-calls [--mutate 2]

`--mutate N`: also up to N variants per task, each the task's reference calls up to one whose argument is
changed (`traces.mutating.changes`), replayed on a fresh episode: the server's real errors, on the
suite's sandbox (each episode its own state), as `envace traces import --mutate` does for a user's log.
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from typing import Any

import anyio


async def record_suite_calls(suite: Any, tasks: list[Any], out: str | Path, mutate: int = 0, seed: int = 0) -> int:
    """One trace per task (its reference calls and their real replies) into `out`, and `mutate` variants
    per task (see the module); returns the calls recorded."""
    import random

    from envace_mcp.traces.mutating import changes

    rng = random.Random(seed)
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.traces import Step, Trace, TraceStore

    store, calls = TraceStore(out), 0
    with suite.servers("stdio") as config:
        async with Toolbox(config) as toolbox:
            seen: dict[str, list[str]] = {}
            for task in tasks:
                for action in task.actions:
                    for key, value in action.arguments.items():
                        if isinstance(value, str) and value not in seen.setdefault(key, []):
                            seen[key].append(value)

            async def play(task: Any, actions: list[Any], metadata: dict[str, Any], run_id: str | None = None) -> int:
                scope = suite.episode(task).scope(toolbox)  # the task's own episode: its state, as a run sees it
                trace = Trace(run_id=run_id or uuid.uuid4().hex, task_id=task.id, suite=suite.name, task=task.instruction,
                              started_at=time.time(), tools=[spec.to_dict() for spec in scope.catalog], metadata=metadata)
                for i, (tool, arguments) in enumerate(actions):
                    result = await scope.call(tool, arguments)
                    trace.steps.append(Step(index=i, role="tool", call_id=f"ref-{i}", time=time.time(), tool=tool,
                                            arguments=arguments, result=result.model_dump(mode="json")))
                trace.ended_at = time.time()
                store.append(trace)
                return len(actions)

            for task in tasks:
                actions = [(a.tool, a.arguments) for a in task.actions]
                run_id = uuid.uuid4().hex
                calls += await play(task, actions, {"source": "reference calls"}, run_id)
                positions = list(range(len(actions)))
                rng.shuffle(positions)
                for position in positions[:mutate]:
                    tool, arguments = actions[position]
                    spec = toolbox.catalog.get(tool)
                    options = changes(arguments, spec, seen, rng) if spec is not None else {}
                    if not options:
                        continue
                    name = rng.choice(sorted(options))
                    new = rng.choice(options[name])
                    variant = [*actions[:position], (tool, {**arguments, name: new})]
                    calls += await play(task, variant, {"source": "reference calls, one argument changed",
                                                        "mutated_from": run_id,
                                                        "mutation": f"{name}: {arguments[name]!r} -> {new!r}"})
    return calls


def main(argv: list[str] | None = None) -> None:
    from envace_mcp.envs import get_suite

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--out", required=True)
    parser.add_argument("--limit", type=int, default=None, help="first N tasks of the split")
    parser.add_argument("--mutate", type=int, default=0, help="variants per task with one argument changed")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    suite = get_suite(args.suite)
    tasks = list(suite.split(args.split))[: args.limit]
    calls = anyio.run(record_suite_calls, suite, tasks, args.out, args.mutate, args.seed)
    print(f"{len(tasks)} tasks, {calls} real calls recorded in {args.out}")


if __name__ == "__main__":
    main()
