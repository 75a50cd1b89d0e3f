"""Tool results as data: one type for successes, tool errors and toolbox errors alike."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from envace_mcp.toolbox.catalog import ToolSpec

ErrorKind = Literal["invalid_arguments", "unknown_tool", "timeout", "server_died", "tool_error", "denied",
                    "tool_changed", "input_required"]
"""Why a result is an error.

- `invalid_arguments`: the arguments violate the tool's input schema; the server was not called.
- `unknown_tool`: no tool of that name in the catalog; no server was called.
- `timeout`: the call ran past its timeout and was cancelled; the toolbox stays usable.
- `server_died`: the server's transport closed during the call; the server is restarted on the next call.
- `tool_error`: the server answered with `isError: true` or a protocol error.
- `denied`: the tool is excluded by the server's allow/deny lists; the server was not called.
- `tool_changed`: the call carried the catalog entry it was gated by (`expect`) and the live entry of
  that name is another tool now (a server restarted with another listing); the server was not called.
- `input_required`: the server asked questions before it can finish (`input_required`); not finished
  until `Toolbox.respond` sends the answers.
"""


NOT_THE_SERVERS: frozenset[str] = frozenset({"invalid_arguments", "unknown_tool", "timeout", "server_died", "denied",
                                             "tool_changed"})
"""Error kinds the toolbox writes itself: no server answered (a world model learns nothing from them; a
reward counts them as refusals, not as what a server said)."""


class ToolResult(BaseModel):
    """What one tool call produced: content, structured content, and whether (and why) it failed.

    Structured content is kept on errors too (MCP allows it; several adapters drop it).
    """

    model_config = ConfigDict(frozen=True)

    tool: str
    """The catalog name the call was made with (prefixed when two servers share a name)."""
    server: str | None = None
    """The server that owns the tool; `None` when no server could be identified (unknown tool)."""
    arguments: dict[str, Any] | Any = Field(default_factory=dict)
    content: list[dict[str, Any]] = Field(default_factory=list)
    """MCP content blocks as JSON objects (`{"type": "text", "text": ...}`, images, resources)."""
    structured_content: Any = None
    """Any JSON value since MCP 2026-07-28 (an array, a string, a number, an object; 2025 revisions
    allowed objects only). `None` when the result had none: a server's explicit `null` reads the same."""
    is_error: bool = False
    error_kind: ErrorKind | None = None
    latency_s: float = 0.0
    input_required: dict[str, Any] | None = None
    """The server's questions when it asked before finishing (`toolbox.asking.InputRequired` JSON)."""
    asked: list[dict[str, Any]] | None = None
    """Questions a 2025-era server sent in the middle of this call (`elicitation/create`) that the caller's
    `ask` answered: `[{"round", "questions", "answers"}]` (`answers` None: not answered)."""
    task: dict[str, Any] | None = None
    """When the server ran the call as a task (MCP tasks extension): its life as `toolbox.tasks.TaskLife`
    JSON — `task_id`, `statuses` ([status, seconds since creation] pairs), `polls`, `final_status`,
    `cancel_sent`. The result itself is always the task's final one, never its handle."""
    truncated: dict[str, int | None] | None = None
    """Set on a result a trace stored cut (`traces.schema.RESULT_CHARS`): the characters its content held
    (`content_chars`: text, and other blocks as JSON), its structured content as JSON (`structured_chars`,
    None: it had none) and how many of the content's were kept (`kept_chars`). None: whole."""

    @property
    def text(self) -> str:
        """The text blocks joined by newlines; non-text blocks are summarised in brackets."""
        parts: list[str] = []
        for block in self.content:
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                parts.append(f"[{block.get('type', 'content')}: {block.get('mimeType') or block.get('uri') or ''}]")
        return "\n".join(parts)

    @staticmethod
    def text_of(result: dict[str, Any] | None) -> str:
        """`text` of a result in its JSON form (as traces keep it): what a tool message showed the model."""
        if not result:
            return ""
        return ToolResult(tool=str(result.get("tool") or ""), content=list(result.get("content") or [])).text

    @property
    def value(self) -> Any:
        """Structured content when present, else the text parsed as JSON when it is JSON, else the text."""
        if self.structured_content is not None:
            return self.structured_content
        text = self.text
        try:
            return json.loads(text)
        except (ValueError, TypeError):
            return text

    @classmethod
    def error(
        cls,
        kind: ErrorKind,
        message: str,
        *,
        tool: str,
        server: str | None = None,
        arguments: Any = None,
        details: dict[str, Any] | None = None,
        latency_s: float = 0.0,
    ) -> ToolResult:
        """A toolbox-made error result: the message as text, kind and details as structured content."""
        return cls(
            tool=tool,
            server=server,
            arguments=arguments if arguments is not None else {},
            content=[{"type": "text", "text": message}],
            structured_content={"error": kind, "message": message, **(details or {})},
            is_error=True,
            error_kind=kind,
            latency_s=latency_s,
        )


def tool_changed(name: str, arguments: Any, expect: ToolSpec, now: ToolSpec | None) -> ToolResult:
    """The `tool_changed` error: `name` was gated as `expect` and is `now` (`None`: gone); nothing ran."""
    what = f"now {now.summary()}" if now is not None else "no tool of that name is offered now"
    return ToolResult.error("tool_changed", f"tool {name!r} changed since it was gated: {what}; not run", tool=name,
                            server=now.server if now is not None else expect.server, arguments=arguments,
                            details={"gated": expect.to_dict(), "now": now.to_dict() if now is not None else None})
