"""`RehearsingToolNode`: a drop-in for LangGraph's `ToolNode` that rehearses and gates each call.

    builder = StateGraph(MessagesState)
    builder.add_node("agent", call_model)
    builder.add_node("tools", RehearsingToolNode(toolbox, policy))     # instead of ToolNode(tools)
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")

Each ToolMessage carries its rehearsal record (prediction, gate decision and reason, real result,
match score) in `additional_kwargs["envace_rehearsal"]`; with `record_key="rehearsals"` and a state
channel of that name (reducer `envace_mcp.graph.state.upsert_records`) the records also land in state.
"""

from __future__ import annotations

from typing import Any

from envace_mcp.graph._dropin import rehearse_gate_act
from envace_mcp.graph.gate import GateConfig, Mode
from envace_mcp.graph.nodes._common import last_ai
from envace_mcp.graph.state import EnvaceContext


class RehearsingToolNode:
    """Rehearse → gate → execute the last AI message's tool calls against an MCP toolbox."""

    def __init__(self, toolbox: Any, policy: Any, *, gate: GateConfig | None = None, mode: Mode = "real",
                 tools: list[Any] | None = None, record_key: str | None = None, name: str = "tools") -> None:
        self.context = EnvaceContext(policy=policy, toolbox=toolbox, tools=tools, gate=gate or GateConfig(), mode=mode)
        self.record_key = record_key
        self.name = name

    async def __call__(self, state: Any) -> dict[str, Any]:
        messages = state["messages"] if isinstance(state, dict) else state.messages
        ai = last_ai(messages)
        if ai is None or not ai.tool_calls:
            return {"messages": []}
        history = state.get(self.record_key, []) if self.record_key and isinstance(state, dict) else []
        replies, records = await rehearse_gate_act(self.context, list(messages[:-1]), ai, history)
        update: dict[str, Any] = {"messages": replies}
        if self.record_key:
            update[self.record_key] = records
        return update
