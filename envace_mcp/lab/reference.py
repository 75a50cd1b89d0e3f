"""Recording reference solutions of a bundled suite as traces (teacher forcing), for SFT."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envace_mcp.envs import get_suite
from envace_mcp.envs.reference import reference_roles
from envace_mcp.graph import GateConfig, create_envace_graph
from envace_mcp.lab.probes import schema_checks
from envace_mcp.lab.rehearsed import imagined_notes, imagined_paths
from envace_mcp.policy.forced import ForcedPolicy
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import Reward, TraceStore
from envace_mcp.train.forced_runs import EVERY_CALL_RUNS, forced_run


async def record_reference_traces(model: Any, suite_name: str, out: str | Path, *, split: str = "train",
                                  limit: int | None = None, on_task: Callable[[str, float], None] | None = None,
                                  score: bool = True, own_rehearsals: bool = False,
                                  sampling: dict[str, Any] | None = None, only: set[str] | None = None,
                                  rehearsed: int = 0, seed: int = 0) -> int:
    """Replay each task's reference solution through the graph (real mode, in-process server),
    record it with `model`'s exact tokens and logprobs (`score=False`: tokens only, much faster, enough
    for SFT), attach the checker's score. `own_rehearsals`: the model rehearses each reference call
    itself (greedy unless `sampling` says otherwise) and the trace compares it with the real result —
    the world model's accuracy on real calls. `rehearsed` > 0: each run starts with the rehearsal memory
    of that many imagined attempts (`lab.rehearsed`, drawn with `seed`), as under test-time rehearsal.
    Returns runs written."""
    suite = get_suite(suite_name)
    tasks = [t for t in suite.split(split) if only is None or t.id in only]
    tasks = tasks[:limit] if limit else tasks
    store = TraceStore(out)
    graph = create_envace_graph().compile()
    written = 0
    async with Toolbox({suite_name: suite.build_server()}) as toolbox:
        schemas, valid = schema_checks(toolbox, suite_name)
        for task in tasks:
            notes, kinds = None, None
            if rehearsed:
                paths = imagined_paths(task, suite, schemas, valid, n=rehearsed, rng=random.Random(f"{seed}:{task.id}"))
                notes = await imagined_notes(graph, toolbox, suite, task, model, GateConfig(), paths)
                kinds = [kind for kind, _ in paths]
            roles = reference_roles(suite, task, rehearse_format=getattr(model, "rehearse_format", "simulator"))
            if own_rehearsals:
                roles.pop("rehearse", None)
            gate = EVERY_CALL_RUNS if own_rehearsals else GateConfig(rehearse="all")
            episode, state, trace = await forced_run(graph, toolbox, suite, task, ForcedPolicy(model, **roles, score=score),
                                                     gate, sampling, notes=notes)
            if kinds:
                trace.metadata["imagined"] = kinds
            verdict = suite.check(task, await episode.final_state(toolbox), state.get("final_answer") or "")
            trace.rewards.append(Reward(name="task", value=verdict.score, details=verdict.to_dict()))
            store.append(trace)
            written += 1
            if on_task is not None:
                on_task(task.id, verdict.score)
    return written
