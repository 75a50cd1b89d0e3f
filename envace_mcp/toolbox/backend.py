"""The tool-backend seam: what the graph needs from whatever runs tools, as one narrow interface
(the shape of openai-agents' `MCPServer`): a catalog, and a call that never raises for tool or server
failures."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from envace_mcp.toolbox.asking import Asker
from envace_mcp.toolbox.catalog import ToolCatalog, ToolSpec
from envace_mcp.toolbox.result import ToolResult


class ToolBackend(ABC):
    """A catalog of tools and a way to call them (`Toolbox`, `ToolboxScope`; subclass it for your own).

    The graph calls every backend with the full signature below, so a backend of your own takes every
    keyword, even where it has no use for one (answer `ask` with nothing, ignore `meta`); `expect` is the
    one it must honour: a call whose live tool is not `expect` runs nothing.
    """

    @property
    @abstractmethod
    def catalog(self) -> ToolCatalog:
        """The tools, named as the model calls them."""

    @abstractmethod
    async def call(self, name: str, arguments: Mapping[str, Any] | None = None, *, timeout: float | None = None,
                   expect: ToolSpec | None = None, ask: Asker | None = None,
                   meta: Mapping[str, Any] | None = None) -> ToolResult:
        """Run a tool; failures are results with an `error_kind`, never exceptions.

        - `timeout`: seconds for this call (None: the backend's default);
        - `expect`: the catalog entry the call was gated as; the call runs only if the live entry of
          `name` is still that tool (`ToolSpec.same_tool`), else a `tool_changed` error result and nothing run;
        - `ask`: answers a 2025-era server's mid-call questions (elicitation); None refuses them;
        - `meta`: sent as the request's `_meta` (a scope's own meta wins over it).
        """
