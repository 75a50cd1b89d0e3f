from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage

from envace_mcp.graph.memory import render_memory
from envace_mcp.policy.types import ActRequest, Generation


def split_task(messages: list[AnyMessage], task: str | None) -> tuple[str, list[AnyMessage]]:
    """The task (explicit, or the first human message) and the conversation after it."""
    for i, message in enumerate(messages):
        if isinstance(message, HumanMessage):
            return task or str(message.content), list(messages[i + 1:])
    return task or "", list(messages)


def act_request(state: Any, ctx: Any, messages: list[AnyMessage] | None = None) -> ActRequest:
    """What the act role sees for `messages` (default: the state's): the agent node asks with it, and an
    inline rehearsal continues the same request (memory included) after the proposed call."""
    task, conversation = split_task(list(state["messages"] if messages is None else messages), state.get("task"))
    return ActRequest(task=task, messages=conversation, tools=ctx.catalog(),
                      memory=render_memory(state.get("rehearsals", []), state.get("notes"), limit=ctx.memory_items),
                      instructions=ctx.instructions)


def last_ai(messages: list[AnyMessage]) -> AIMessage | None:
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return message
    return None


def emit(runtime: Any, node: str, generation: Generation[Any], **extra: Any) -> None:
    """Hand a generation (tokens, logprobs) to the `custom` stream, where trace recorders read it.
    Generations never enter graph state: they are big and state is persisted at every step."""
    writer = getattr(runtime, "stream_writer", None)
    if writer is not None:
        writer({"envace": "generation", "node": node, "generation": generation, **extra})
