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
    trace: Any = None


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
    store: Any = None,
    group_id: str | None = None,
) -> TaskRun:
    """Run the agent on `task` against `toolbox` (one fresh episode), then check the final state.

    With a `store`, the committed run is recorded (`envace_mcp.traces`) with the checker's score
    attached as the `task` reward."""
    from envace_mcp.graph.tts import condense, imagine
    from envace_mcp.traces import Reward, record_run

    episode = suite.episode(task)
    context = EnvaceContext(policy=policy, toolbox=episode.scope(toolbox), gate=gate or GateConfig(),
                            mode=mode, instructions=suite.instructions, sampling=sampling or {})
    graph = create_envace_graph()
    attempts: list[Any] = []
    if rehearse_n > 0:
        attempts = await imagine(graph, task.instruction, context, n=rehearse_n, strategy=strategy)
    notes = {"notes": condense(attempts)} if attempts else {}
    state, trace = await record_run(graph.compile(), {"messages": [HumanMessage(content=task.instruction)], **notes},
                                    context=context, store=store, on_update=on_update, task_id=task.id,
                                    suite=suite.name, group_id=group_id,
                                    rehearsal={"n": rehearse_n, "strategy": strategy} if rehearse_n else {})
    verdict = await suite.score(episode, toolbox, state)
    reward = Reward(name="task", value=verdict.score, details=verdict.to_dict())
    trace.rewards.append(reward)
    if store is not None:  # the run itself was stored by record_run, failed or not
        store.attach_reward(trace.run_id, reward)
    return TaskRun(task=task, episode=episode, state=state, verdict=verdict, attempts=attempts, trace=trace)
