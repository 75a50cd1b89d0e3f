"""Real calls of a task suite without a model: each task's reference calls, run in order on its own
episode of the suite's real server, recorded as traces with the catalog attached — world-model data for
servers the shipped adapter never saw (τ²-airline), as a user's recorded calls would be.

    python -m envace_mcp.lab.suite_calls --suite tau2-airline --split test --out runs/airline-calls
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from typing import Any

import anyio


async def record_suite_calls(suite: Any, tasks: list[Any], out: str | Path) -> int:
    """One trace per task (its reference calls and their real replies) into `out`; returns the calls."""
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.traces import Step, Trace, TraceStore

    store, calls = TraceStore(out), 0
    with suite.servers("stdio") as config:
        async with Toolbox(config) as toolbox:
            for task in tasks:
                scope = suite.episode(task).scope(toolbox)  # the task's own episode: its state, as a run sees it
                trace = Trace(run_id=uuid.uuid4().hex, task_id=task.id, suite=suite.name, task=task.instruction,
                              started_at=time.time(), tools=[spec.to_dict() for spec in scope.catalog],
                              metadata={"source": "reference calls"})
                for i, action in enumerate(task.actions):
                    result = await scope.call(action.tool, action.arguments)
                    trace.steps.append(Step(index=i, role="tool", call_id=f"ref-{i}", time=time.time(), tool=action.tool,
                                            arguments=action.arguments, result=result.model_dump(mode="json")))
                    calls += 1
                trace.ended_at = time.time()
                store.append(trace)
    return calls


def main(argv: list[str] | None = None) -> None:
    from envace_mcp.envs import get_suite

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--out", required=True)
    parser.add_argument("--limit", type=int, default=None, help="first N tasks of the split")
    args = parser.parse_args(argv)
    suite = get_suite(args.suite)
    tasks = list(suite.split(args.split))[: args.limit]
    calls = anyio.run(record_suite_calls, suite, tasks, args.out)
    print(f"{len(tasks)} tasks, {calls} real calls recorded in {args.out}")


if __name__ == "__main__":
    main()
