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
            episode = Episode(task, suite_name)
            roles = reference_roles(suite, task, rehearse_format=getattr(model, "rehearse_format", "simulator"))
            if own_rehearsals:
                roles.pop("rehearse", None)
            policy = ForcedPolicy(model, **roles, score=score)
            gate = GateConfig(rehearse="all")
            if own_rehearsals:  # every reference call must really run, whatever the model predicted
                gate = GateConfig(rehearse="all", feedback_on_predicted_error=False,
                                  block_destructive_on_predicted_failure=False)
            context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta), gate=gate,
                                    instructions=suite.server_module.POLICY, sampling=sampling or {})
            state, trace = await record_run(graph, {"messages": [HumanMessage(content=task.instruction)]},
                                            context=context, task_id=task.id, suite=suite_name, group_id=task.id)
            verdict = suite.check(task, await episode.final_state(toolbox), state.get("final_answer") or "")
            trace.rewards.append(Reward(name="task", value=verdict.score, details=verdict.to_dict()))
            store.append(trace)
            written += 1
            if on_task is not None:
                on_task(task.id, verdict.score)
    return written
