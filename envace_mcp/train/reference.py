"""Recording reference solutions of a bundled suite as traces (teacher forcing), for SFT."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage

from envace_mcp.eval import Episode, get_suite
from envace_mcp.eval.reference import reference_roles
from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.policy.forced import ForcedPolicy
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import Reward, TraceStore, record_run


async def record_reference_traces(model: Any, suite_name: str, out: str | Path, *, split: str = "train",
                                  limit: int | None = None, on_task: Callable[[str, float], None] | None = None,
                                  score: bool = True, own_rehearsals: bool = False,
                                  sampling: dict[str, Any] | None = None, only: set[str] | None = None) -> int:
    """Replay each task's reference solution through the graph (real mode, in-process server),
    record it with `model`'s exact tokens and logprobs (`score=False`: tokens only, much faster, enough
    for SFT), attach the checker's score. `own_rehearsals`: the model rehearses each reference call
    itself (greedy unless `sampling` says otherwise) and the trace compares it with the real result —
    the world model's accuracy on real calls. Returns runs written."""
    suite = get_suite(suite_name)
    tasks = [t for t in suite.split(split) if only is None or t.id in only]
    tasks = tasks[:limit] if limit else tasks
    store = TraceStore(out)
    graph = create_envace_graph().compile()
    written = 0
    async with Toolbox({suite_name: suite.build_server()}) as toolbox:
        for task in tasks:
            roles = reference_roles(suite, task, rehearse_format=getattr(model, "rehearse_format", "simulator"))
            if own_rehearsals:
                roles.pop("rehearse", None)
            gate = EVERY_CALL_RUNS if own_rehearsals else GateConfig(rehearse="all")
            episode, state, trace = await forced_run(graph, toolbox, suite, task, ForcedPolicy(model, **roles, score=score),
                                                     gate, sampling)
            verdict = suite.check(task, await episode.final_state(toolbox), state.get("final_answer") or "")
            trace.rewards.append(Reward(name="task", value=verdict.score, details=verdict.to_dict()))
            store.append(trace)
            written += 1
            if on_task is not None:
                on_task(task.id, verdict.score)
    return written


EVERY_CALL_RUNS = GateConfig(rehearse="all", feedback_on_predicted_error=False,
                             block_destructive_on_predicted_failure=False)
"""Every call is rehearsed and really runs, whatever the rehearsal predicted: measuring the world model
on real calls, and probes (each perturbed call must reach the server)."""


async def forced_run(graph: Any, toolbox: Any, suite: Any, task: Any, policy: Any, gate: GateConfig,
                     sampling: dict[str, Any] | None = None, group_id: str | None = None) -> tuple[Episode, dict[str, Any], Any]:
    """One recorded run of `task` in its own episode on `toolbox` (the suite's in-process server), the
    agent's roles answered by `policy` (a `ForcedPolicy`): (episode, final state, trace)."""
    episode = Episode(task, suite.name)
    context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta), gate=gate,
                            instructions=suite.server_module.POLICY, sampling=sampling or {})
    state, trace = await record_run(graph, {"messages": [HumanMessage(content=task.instruction)]}, context=context,
                                    task_id=task.id, suite=suite.name, group_id=group_id or task.id)
    return episode, state, trace
