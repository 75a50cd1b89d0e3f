"""`RehearsalMiddleware` for `langchain.agents.create_agent` (needs the optional `langchain` package).

    agent = create_agent(model, tools=toolbox.langchain_tools(), middleware=[RehearsalMiddleware(policy)])

Every tool call the agent makes is rehearsed (per the gate's `rehearse` rule), gated, and only then
handed to the real tool; calls the gate stops come back as error ToolMessages explaining why, with
the rehearsed outcome. Records ride on `ToolMessage.additional_kwargs["envace_rehearsal"]`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from envace_mcp.errors import UserError
from envace_mcp.graph._dropin import rehearse_gate_act, spec_from_tool
from envace_mcp.graph.gate import GateConfig, Mode
from envace_mcp.graph.state import EnvaceContext

try:
    from langchain.agents.middleware import AgentMiddleware
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    raise UserError("RehearsalMiddleware needs `langchain` (pip install 'envace-mcp[langchain]')") from exc


class RehearsalMiddleware(AgentMiddleware):
    """Rehearse and gate each tool call of a `create_agent` agent."""

    def __init__(self, policy: Any, *, gate: GateConfig | None = None, mode: Mode = "real",
                 instructions: str | None = None) -> None:
        super().__init__()
        self.policy = policy
        self.gate = gate or GateConfig()
        self.mode: Mode = mode
        self.instructions = instructions

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> ToolMessage | Any:
        tool = request.tool
        specs = [spec_from_tool(tool)] if tool is not None else []
        context = EnvaceContext(policy=self.policy, tools=specs, gate=self.gate, mode=self.mode,
                                instructions=self.instructions)
        call = request.tool_call
        messages = list(request.state.get("messages", [])) if isinstance(request.state, dict) else []
        ai = AIMessage(content="", tool_calls=[call])

        async def execute(_: dict[str, Any]) -> Any:
            return await handler(request)

        replies, _ = await rehearse_gate_act(context, messages[:-1] if messages else [], ai, execute=execute)
        return replies[0]
