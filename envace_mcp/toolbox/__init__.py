"""MCP toolbox: persistent sessions to many servers, one catalog, validated calls, results as data.

The only package of envace-mcp that imports `mcp`. The modules that speak to servers load on first use:
the catalog, results and configuration import nothing of `mcp`, so the drop-ins can gate tools from a
program pinned to another `mcp` (langchain-mcp-adapters needs mcp<2).
"""

from envace_mcp.toolbox.backend import ToolBackend
from envace_mcp.toolbox.catalog import ToolAnnotations, ToolCatalog, ToolSpec
from envace_mcp.toolbox.config import HttpServer, InProcessServer, ServerSpec, StdioServer, load_servers
from envace_mcp.toolbox.result import ErrorKind, ToolResult

_LAZY = {
    "ServerStartError": "envace_mcp.toolbox._connection",
    "DEFAULT_TIMEOUT_S": "envace_mcp.toolbox.toolbox",
    "Toolbox": "envace_mcp.toolbox.toolbox",
    "ToolboxScope": "envace_mcp.toolbox.toolbox",
    "blocking_toolbox": "envace_mcp.toolbox.toolbox",
}


def __getattr__(name: str):  # noqa: ANN202 - the modules that import `mcp`: only when asked
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'envace_mcp.toolbox' has no attribute {name!r}")


__all__ = [
    # the toolbox
    "ToolBackend",
    "Toolbox",
    "ToolboxScope",
    "blocking_toolbox",
    "DEFAULT_TIMEOUT_S",
    # configuration
    "load_servers",
    "ServerSpec",
    "StdioServer",
    "HttpServer",
    "InProcessServer",
    # catalog and results
    "ToolCatalog",
    "ToolSpec",
    "ToolAnnotations",
    "ToolResult",
    "ErrorKind",
    # errors
    "ServerStartError",
]
