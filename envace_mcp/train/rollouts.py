"""Fresh rollouts for GRPO: K runs of one task (`envs.runner.run_task`), concurrent, so their
generations share the policy's batches; each recorded and scored by the suite's checker.

Rewards are the checker's (a pure named function returning value + details): on the episode's final
server state in real / mixed mode; in simulated mode (EnvACE's training) no server state exists, so the
run's calls are replayed with the domain's own functions (`Suite.score_replayed`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from envace_mcp.envs.runner import run_task
from envace_mcp.envs.task import Task
from envace_mcp.graph import GateConfig, RunLimits
from envace_mcp.graph.gate import Mode
from envace_mcp.traces import Trace

if TYPE_CHECKING:
    from envace_mcp.envs.episode import EpisodeToolbox
    from envace_mcp.envs.suites import TaskSuite
    from envace_mcp.policy.base import Policy


async def rollout_group(suite: TaskSuite, task: Task, policy: Policy, *, k: int = 4, mode: Mode = "real",
                        toolbox: EpisodeToolbox | None = None, tools: list[Any] | None = None,
                        gate: GateConfig | None = None, limits: RunLimits | None = None,
                        sampling: dict[str, Any] | None = None,
                        group_id: str | None = None) -> list[Trace]:
    """K concurrent runs of `task` (one GRPO group), each a fresh episode."""
    runs = await asyncio.gather(*(run_task(suite, task, policy=policy, toolbox=None if mode == "simulated" else toolbox,
                                           mode=mode, gate=gate, limits=limits, sampling=sampling, tools=tools,
                                           group_id=group_id or task.id) for _ in range(k)))
    return [run.trace for run in runs]
