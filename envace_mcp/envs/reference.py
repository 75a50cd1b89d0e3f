"""Reference solutions as role functions: what a perfect agent and a perfect simulator would say.

`reference_roles(suite, task)` returns `act` and `rehearse` functions for `ForcedPolicy`: the act role
makes the task's reference calls one per turn, then gives the reference answer; the rehearse role
predicts exactly what the server will return (computed with the domain's own functions on a replay
of the calls so far). Replayed through the graph in real mode, they produce the traces SFT learns
from — act tokens from successful runs, rehearse tokens matched to real results.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage

from envace_mcp.envs.suites import TaskSuite
from envace_mcp.envs.task import Action, Task
from envace_mcp.policy.prompts import tool_call_text, tool_reply_text
from envace_mcp.policy.types import ActRequest, RehearseRequest
from envace_mcp.traces.schema import RehearseFormat


def reference_roles(suite: TaskSuite, task: Task, *, answer: str | None = None,
                    actions: Sequence[Action] | None = None,
                    rehearse_format: RehearseFormat = "simulator") -> dict[str, Callable[[Any], str]]:
    """`rehearse_format` "inline": the rehearse function returns the tool's reply as the server writes
    it (`prompts.tool_reply_text`), the content of the tool turn the model continues with."""
    steps = list(task.actions if actions is None else actions)
    inline = rehearse_format == "inline"

    if answer is None and actions is None and hasattr(suite, "reference_act"):  # multi-turn suites
        return {"act": suite.reference_act(task), "rehearse": _rehearse(suite, task, steps, inline)}

    def act(request: ActRequest) -> str:
        done = calls_made(request.messages)
        if done < len(steps):
            action = steps[done]
            return tool_call_text(action.tool, action.arguments)
        return task.answer if answer is None else answer

    return {"act": act, "rehearse": _rehearse(suite, task, steps, inline)}


def calls_made(messages: Sequence[AnyMessage]) -> int:
    """How many tool-calling turns the agent has taken in `messages` (which reference step is next)."""
    return sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls)


def _rehearse(suite: TaskSuite, task: Task, steps: list[Action],
              inline: bool = False) -> Callable[[RehearseRequest], str]:
    def rehearse(request: RehearseRequest) -> str:
        done = calls_made(request.history)
        result = suite.reference_result(task, steps[:done], request.call.name, dict(request.call.arguments))
        if inline:
            return tool_reply_text(request.call.name, result)
        return f"<execution_result>{json.dumps(result, ensure_ascii=False)}</execution_result>"

    return rehearse
