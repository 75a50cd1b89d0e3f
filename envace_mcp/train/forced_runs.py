"""One recorded run of a task with its roles forced (`policy.forced.ForcedPolicy`): what reference runs
(`train.reference`) and probes (`train.probes`) are both made of."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_core.messages import HumanMessage

from envace_mcp.envs.episode import Episode
from envace_mcp.graph import EnvaceContext, GateConfig
from envace_mcp.graph.gate import UNATTENDED
from envace_mcp.traces import record_run

if TYPE_CHECKING:
    from envace_mcp.envs.task import Task
    from envace_mcp.policy.base import Policy

EVERY_CALL_RUNS = GateConfig(rehearse="all", feedback_on_predicted_error=False,
                             block_destructive_on_predicted_failure=False)
"""Every call is rehearsed and really runs, whatever the rehearsal predicted: measuring the world model
on real calls, and probes (each perturbed call must reach the server)."""


async def forced_run(graph: Any, toolbox: Any, suite: Any, task: Task, policy: Policy, gate: GateConfig,
                     sampling: dict[str, Any] | None = None, group_id: str | None = None,
                     notes: str | None = None) -> tuple[Episode, dict[str, Any], Any]:
    """One recorded run of `task` in its own episode on `toolbox` (the suite's in-process server), the
    agent's roles answered by `policy` (a `ForcedPolicy`): (episode, final state, trace). `notes`: the
    rehearsal memory the run starts with (`graph.tts.condense`). Nobody approves on the suite's sandbox
    server: the gate runs `UNATTENDED` (its other rules as given)."""
    episode = Episode(task, suite.name)
    context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta),
                            gate=gate.model_copy(update=UNATTENDED),
                            instructions=suite.server_module.POLICY, sampling=sampling or {})
    start = {"messages": [HumanMessage(content=task.instruction)], **({"notes": notes} if notes else {})}
    state, trace = await record_run(graph, start, context=context,
                                    task_id=task.id, suite=suite.name, group_id=group_id or task.id)
    return episode, state, trace
