"""envace-mcp: agents that rehearse before they act (EnvACE) for LangGraph and MCP."""

from envace_mcp._version import __version__
from envace_mcp.errors import ConfigError, EnvaceError, UserError  # noqa: E402
from envace_mcp.toolbox import ToolAnnotations, ToolCatalog, ToolResult, ToolSpec, load_servers  # noqa: E402

_LAZY = {
    "Toolbox": "envace_mcp.toolbox",
    "blocking_toolbox": "envace_mcp.toolbox",
    "ServerStartError": "envace_mcp.toolbox",
    "create_envace_graph": "envace_mcp.graph",
    "EnvaceContext": "envace_mcp.graph",
    "GateConfig": "envace_mcp.graph",
    "RunLimits": "envace_mcp.graph",
    "load_policy": "envace_mcp.policy",
    "Policy": "envace_mcp.policy",
    "SamplingParams": "envace_mcp.policy",
}


def __getattr__(name: str):  # noqa: ANN202 - graph and policy load langgraph/torch, the toolbox `mcp`: only when asked
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'envace_mcp' has no attribute {name!r}")


__all__ = [
    "__version__",
    # graph and policy (loaded on first use)
    "create_envace_graph",
    "EnvaceContext",
    "GateConfig",
    "RunLimits",
    "load_policy",
    "Policy",
    "SamplingParams",
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
