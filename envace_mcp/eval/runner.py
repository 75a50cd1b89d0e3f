"""Running the EnvACE graph on a suite task as one isolated episode, and scoring it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import HumanMessage

from envace_mcp.eval.suites import Episode, Suite
from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.graph.gate import Mode
from envace_mcp.servers._common import CheckResult, Task


@dataclass
class TaskRun:
    task: Task
    episode: Episode
    state: dict[str, Any]
    verdict: CheckResult
    attempts: list[Any]


async def run_task(
    suite: Suite,
    task: Task,
    *,
    policy: Any,
    toolbox: Any,
    mode: Mode = "real",
    gate: GateConfig | None = None,
    rehearse_n: int = 0,
    strategy: Literal["parallel", "sequential"] = "parallel",
    on_update: Any = None,
    sampling: dict[str, Any] | None = None,
) -> TaskRun:
    """Run the agent on `task` against `toolbox` (one fresh episode), then check the final state."""
    from envace_mcp.graph.tts import rehearse_then_act

    episode = Episode(task, suite.name)
    context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta), gate=gate or GateConfig(),
                            mode=mode, instructions=suite.server_module.POLICY, sampling=sampling or {})
    graph = create_envace_graph()
    attempts: list[Any] = []
    if rehearse_n > 0:
        state, attempts = await rehearse_then_act(graph, task.instruction, context, n=rehearse_n, strategy=strategy)
    else:
        state = {}
        async for kind, chunk in graph.compile().astream({"messages": [HumanMessage(content=task.instruction)]},
                                                         context=context, stream_mode=["updates", "values"]):
            if kind == "values":
                state = chunk
            elif on_update is not None:
                for node, update in chunk.items():
                    on_update(node, update)
    final = await episode.final_state(toolbox)
    answer = state.get("final_answer") or ""
    return TaskRun(task=task, episode=episode, state=state, verdict=suite.check(task, final, answer), attempts=attempts)
