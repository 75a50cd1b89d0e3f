"""Fresh rollouts for GRPO: K graph runs per task, batched through the policy, each recorded and scored.

Rewards come from the suite's checker (a pure named function returning value + details):
- real / mixed mode: the episode's final server state and the final answer;
- simulated mode (EnvACE training): no server state exists, so the run's simulated write calls are
  replayed with the domain's own functions on the task's initial state, then checked the same way.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from langchain_core.messages import HumanMessage

from envace_mcp.eval import Episode
from envace_mcp.eval.suites import Suite
from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.graph.gate import Mode
from envace_mcp.servers._common import CheckResult, DomainError, Task
from envace_mcp.traces import Reward, Trace, record_run


def replay_reward(suite: Suite, task: Task, trace: Trace) -> CheckResult:
    """Score a simulated run: apply its executed-or-simulated calls to the task's initial state."""
    state = copy.deepcopy(task.initial_state)
    for step in trace.steps:
        if step.role != "tool" or step.decision not in ("simulate", "execute") or step.tool is None:
            continue
        if step.result is not None and step.result.get("is_error"):
            continue
        try:
            suite.server_module.apply(state, step.tool, dict(step.arguments or {}))
        except (DomainError, KeyError, TypeError):
            continue
    return suite.check(task, state, trace.final_answer or "")


async def rollout_group(suite: Suite, task: Task, policy: Any, *, k: int = 4, mode: Mode = "simulated",
                        toolbox: Any = None, tools: list[Any] | None = None, gate: GateConfig | None = None,
                        sampling: dict[str, Any] | None = None, group_id: str | None = None) -> list[Trace]:
    """K concurrent runs of `task` (one GRPO group); their generations share batches in the policy."""
    graph = create_envace_graph().compile()
    group = group_id or task.id

    async def one() -> Trace:
        episode = Episode(task, suite.name)
        scope = toolbox.scoped(episode.meta) if toolbox is not None else None
        context = EnvaceContext(policy=policy, toolbox=scope, tools=tools, gate=gate or GateConfig(), mode=mode,
                                instructions=suite.server_module.POLICY, sampling=sampling or {})
        _, trace = await record_run(graph, {"messages": [HumanMessage(content=task.instruction)]}, context=context,
                                    task_id=task.id, suite=suite.name, group_id=group)
        if mode == "simulated" or toolbox is None:
            verdict = replay_reward(suite, task, trace)
        else:
            verdict = suite.check(task, await episode.final_state(toolbox), trace.final_answer or "")
        trace.rewards.append(Reward(name="task", value=verdict.score, details=verdict.to_dict()))
        return trace

    return list(await asyncio.gather(*(one() for _ in range(k))))
