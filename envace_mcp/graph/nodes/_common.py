from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage

from envace_mcp.policy.types import Generation


def split_task(messages: list[AnyMessage], task: str | None) -> tuple[str, list[AnyMessage]]:
    """The task (explicit, or the first human message) and the conversation after it."""
    for i, message in enumerate(messages):
        if isinstance(message, HumanMessage):
            return task or str(message.content), list(messages[i + 1:])
    return task or "", list(messages)


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
