"""One run of one task as an isolated episode on its server, and the keys that isolate it.

Every tool call of an episode carries `_meta` keys `envace/episode` (a state key) and `envace/task` (a
suite task id). A server that honours them (the bundled ones do) builds the episode's state from that
task's initial state on the first call, so parallel runs never share state and a new key is a reset;
it shows the episode's state as the resource `envace://episodes/{episode}/state` (the checker reads it;
agents have no tool for it).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from envace_mcp.envs.task import Task
from envace_mcp.toolbox import ToolBackend, Toolbox, ToolboxScope, ToolResult

EPISODE_KEY = "envace/episode"
TASK_KEY = "envace/task"
STATE_URI = "envace://episodes/{episode}/state"

EpisodeToolbox = Toolbox | ToolboxScope
"""What an episode narrows to its own view of the tools: a toolbox, or a scope of one."""


class TaskEpisode(Protocol):
    """What `run_task` needs of a suite's episode (`Episode`, τ²'s, BFCL's, or your own): the task, and
    the agent's view of the tools for this run."""

    task: Task

    def scope(self, toolbox: EpisodeToolbox) -> ToolBackend: ...


@dataclass
class Episode:
    """One run of one task: a private state key on the task's server, and what happened."""

    task: Task
    server: str
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    results: list[ToolResult] = field(default_factory=list)

    @property
    def meta(self) -> dict[str, str]:
        """The `_meta` every call of this episode carries."""
        return {EPISODE_KEY: self.key, TASK_KEY: self.task.id}

    def scope(self, toolbox: EpisodeToolbox) -> ToolboxScope:
        """The view of `toolbox` the agent gets for this episode."""
        return toolbox.scoped(self.meta)

    async def final_state(self, toolbox: EpisodeToolbox) -> dict[str, Any]:
        """The episode's state as the server holds it (the task's initial state if untouched)."""
        text = await toolbox.read_resource(self.server, STATE_URI.format(episode=self.key))
        state = json.loads(text) if text else None
        return state if state is not None else self.task.initial_state
