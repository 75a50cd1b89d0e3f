"""The tool-backend seam: what the graph needs from whatever runs tools."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from envace_mcp.toolbox.catalog import ToolSpec
from envace_mcp.toolbox.result import ToolResult


@runtime_checkable
class ToolBackend(Protocol):
    """A catalog of tools and a way to call them that never raises for tool or server failures
    (`Toolbox`, `ToolboxScope`, or your own)."""

    @property
    def catalog(self) -> Any:
        """The tools' `ToolSpec`s (iterable)."""
        ...

    async def call(self, name: str, arguments: Any = None, *, timeout: float | None = None,
                   expect: ToolSpec | None = None) -> ToolResult:
        """Run a tool; with `expect`, only if its live catalog entry is still that tool
        (`ToolSpec.same_tool`), else a `tool_changed` error result and nothing run."""
        ...

