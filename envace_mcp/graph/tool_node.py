"""`RehearsingToolNode`: LangGraph's `ToolNode`, with each call rehearsed and gated before it runs.

    builder = StateGraph(MessagesState)
    builder.add_node("agent", call_model)
    builder.add_node("tools", RehearsingToolNode(toolbox, policy))     # instead of ToolNode(tools)
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")

It is a `ToolNode` (`handle_tool_errors`, `messages_key`, tool-runtime injection as usual) whose
`wrap_tool_call` / `awrap_tool_call` run the rehearse → gate core. Each ToolMessage carries its
rehearsal record (prediction, gate decision and reason, real result, match score) in
`additional_kwargs["envace_rehearsal"]`; with `record_key="rehearsals"` and a state channel of that
name (reducer `envace_mcp.graph.state.upsert_records`) the records also land in state.

A call the gate stops for the third time since the user's last message (same tool, same arguments) is
answered "will not run: do not propose it again". A tool node cannot end your graph's loop; to end it
there, as the EnvACE graph does, route on `stalled`:

    tools = RehearsingToolNode(toolbox, policy, approve=...)
    builder.add_conditional_edges("tools", lambda state: END if tools.stalled(state) else "agent")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.prebuilt import ToolNode

from envace_mcp.errors import UserError
from envace_mcp.graph.approval import ApprovalRequest, InputRequest
from envace_mcp.graph.dropin import ToolCallRehearsal
from envace_mcp.graph.nodes._stalls import stall
from envace_mcp.graph.gate import GateConfig, Mode, RunLimits, gate_for
from envace_mcp.graph.turn_order import running
from envace_mcp.policy.base import Policy
from envace_mcp.policy.roles import with_world_model


class RehearsingToolNode(ToolNode):
    """Rehearse → gate → run each tool call of the last AI message.

    Args:
        tools: LangChain tools, or a `Toolbox` / `ToolboxScope` (its `langchain_tools()`).
        policy: the policy whose rehearse role predicts each call's outcome.
        approve: answers the gate's `ask` decisions (`require_approval`, by default every destructive call;
            `approve_blocked`). Required unless the gate opts out (`require_approval="never"`): a tool node runs
            all of a turn's calls in one task, so pausing with `interrupt()` would run the calls that already
            ran again on resume. It is asked about a turn's calls one at a time, in the model's order, each
            request saying which call of how many it is (`call_number`, `calls_in_turn`; `turn_order`).
        trust_annotations: False: the read-only / destructive hints of LangChain tools (LangChain's MCP
            libraries', what a server you do not control claims) are not believed: every call is asked.
        **kwargs: `ToolNode`'s own (`handle_tool_errors`, `messages_key`, `name`, `tags`).
    """

    def __init__(self, tools: Any, policy: Policy, *, gate: GateConfig | None = None, limits: RunLimits | None = None,
                 mode: Mode = "real", approve: Callable[[ApprovalRequest | InputRequest], Any] | None = None,
                 record_key: str | None = None, world_model: Any = None,
                 trust_annotations: bool = True, **kwargs: Any) -> None:
        if world_model is not None:  # a world model fitted to your tools rehearses (`roles.with_world_model`)
            policy = with_world_model(policy, world_model)
        gate = gate_for(policy, gate)
        if approve is None and (gate.require_approval != "never" or gate.approve_blocked):
            raise UserError(f"RehearsingToolNode: the gate asks before {gate.require_approval} calls, and a tool node "
                            "asks through `approve=` (a callable given the call and its rehearsed outcome): it runs all "
                            "of a turn's calls in one task, so an interrupt() would re-run the calls that already ran "
                            "on resume. Pass approve=..., or opt out explicitly with "
                            'gate=GateConfig(require_approval="never") (a sandbox, or nobody to ask); create_agent '
                            "with RehearsalMiddleware, or the EnvACE graph, pause per call")
        if hasattr(tools, "langchain_tools"):
            tools = tools.langchain_tools()
        tools = list(tools)
        self.rehearsal = ToolCallRehearsal(policy, gate=gate, limits=limits, mode=mode, tools=tools, approve=approve,
                                           record_key=record_key, messages_key=kwargs.get("messages_key", "messages"),
                                           pauses=False, trust_annotations=trust_annotations)
        super().__init__(tools, wrap_tool_call=self.rehearsal.wrap, awrap_tool_call=self.rehearsal.awrap, **kwargs)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        with running(self._turn(input)):  # each call's thread sees the turn (ToolNode copies the context)
            return super().invoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        with running(self._turn(input)):  # and so does each call's task
            return await super().ainvoke(input, config, **kwargs)

    def _turn(self, input: Any) -> list[str]:
        """The ids of the calls this run of the node runs together, in the model's order: the last AI
        message's, as `ToolNode` reads them; none for calls sent one by one (`Send`), each asked alone."""
        messages = self.rehearsal._messages(input)
        ai = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        return [c.get("id") or "" for c in ai.tool_calls] if ai is not None else []

    def stalled(self, state: Any) -> str | None:
        """Why the run cannot progress, for a router after this node: one call (same tool, same arguments)
        was stopped three times since the user's last message (by the gate, or its approval refused); None
        while it can."""
        stopped = stall(self.rehearsal._messages(state))
        return None if stopped is None else str(stopped)
