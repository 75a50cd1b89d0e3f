"""MCP toolbox: persistent sessions to many servers, one catalog, validated calls, results as data.

The only package of envace-mcp that imports `mcp`.
"""

from envace_mcp.toolbox._connection import ServerStartError
from envace_mcp.toolbox.backend import ToolBackend
from envace_mcp.toolbox.catalog import ToolAnnotations, ToolCatalog, ToolSpec
from envace_mcp.toolbox.config import HttpServer, InProcessServer, ServerSpec, StdioServer, load_servers
from envace_mcp.toolbox.result import ErrorKind, ToolResult
from envace_mcp.toolbox.toolbox import DEFAULT_TIMEOUT_S, Toolbox, ToolboxScope, blocking_toolbox

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
