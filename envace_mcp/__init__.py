"""envace-mcp: agents that rehearse before they act (EnvACE) for LangGraph and MCP."""

__version__ = "0.1.0"

from envace_mcp.errors import ConfigError, EnvaceError, UserError  # noqa: E402
from envace_mcp.toolbox import (  # noqa: E402
    ServerStartError,
    ToolAnnotations,
    Toolbox,
    ToolCatalog,
    ToolResult,
    ToolSpec,
    blocking_toolbox,
    load_servers,
)

__all__ = [
    "__version__",
    # toolbox
    "Toolbox",
    "blocking_toolbox",
    "load_servers",
    "ToolCatalog",
    "ToolSpec",
    "ToolAnnotations",
    "ToolResult",
    # errors
    "EnvaceError",
    "UserError",
    "ConfigError",
    "ServerStartError",
]
