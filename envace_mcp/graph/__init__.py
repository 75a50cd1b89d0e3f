"""The EnvACE graph: rehearse before acting, gate real calls, remember what rehearsal showed."""

from envace_mcp.graph.builder import create_envace_graph
from envace_mcp.graph.gate import (
    ADAPTER_GATE_SETTINGS,
    Decision,
    GateConfig,
    RunLimits,
    adapter_gate,
    gate_for,
    policy_gate,
    decide,
    should_rehearse,
)
from envace_mcp.graph.memory import render_memory
from envace_mcp.graph.state import EnvaceContext, EnvaceState, RehearsalRecord
from envace_mcp.policy.trust import ToolTrust, read_trust

__all__ = [
    "create_envace_graph",
    "EnvaceContext",
    "EnvaceState",
    "RehearsalRecord",
    "GateConfig",
    "RunLimits",
    "adapter_gate",
    "policy_gate",
    "gate_for",
    "ToolTrust",
    "read_trust",
    "ADAPTER_GATE_SETTINGS",
    "Decision",
    "decide",
    "should_rehearse",
    "render_memory",
]
