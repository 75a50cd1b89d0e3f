"""`RehearsalMiddleware` for `langchain.agents.create_agent` (needs the optional `langchain` package).

    agent = create_agent(model, tools=tools, middleware=[RehearsalMiddleware(policy, tools=tools)])
    RehearsalMiddleware(policy, tools=tools, world_model="wm/mine")   # a world model fitted to your tools

Every tool call the agent makes is rehearsed (per the gate's `rehearse` rule), gated, and only then
handed to the real tool; calls the gate stops come back as error ToolMessages explaining why, with
the rehearsed outcome. Records land in the agent's state under `rehearsals` (reducer
`upsert_records`) and ride on `ToolMessage.additional_kwargs["envace_rehearsal"]`.

With other middleware, list them in this order (`after_model` hooks run last-listed first, tool-call
wrappers first-listed outermost):

    middleware=[HumanInTheLoopMiddleware(interrupt_on={"transfer": {"allowed_decisions": [...],
                                                                    "description": rehearsal.describe}}),
                rehearsal,                         # RehearsalMiddleware(policy, tools=tools)
                ToolCallLimitMiddleware(...),      # over-limit calls are stopped before they are rehearsed
                ToolRetryMiddleware(...)]          # retries the real call only, not the rehearsal

so a call is limited, then rehearsed, then shown to the reviewer with its rehearsed outcome; an
edited call is rehearsed again before it runs. With `HumanInTheLoopMiddleware` reviewing calls, give
this middleware `gate=GateConfig(require_approval="never")`, or each destructive call is asked twice.
Given `tools`, the middleware rehearses each turn's calls right after the model (`after_model`);
without, each call is rehearsed when it is about to run.
The gate's own `require_approval` (by default: every destructive call) asks through `approve` or
LangGraph's `interrupt()`, in LangChain's `ToolApprovalRequest` shape (create_agent runs each call as its
own task, so resuming runs no call twice). Tool-call ids the model repeated are made unique right after
the model (`after_model`), before any call is rehearsed, approved or run.

A call the gate stops for the third time since the user's last message (same tool, same arguments) is
answered "will not run: do not propose it again", and once one call was stopped three times (by the gate,
or its approval refused) the agent's loop ends before its next model call (`before_model` jumps to the
end), its state's `stop_reason` saying why: a model that keeps proposing a refused call would otherwise
rehearse it until the agent's recursion limit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.runtime import Runtime
from langgraph.types import Command
from typing_extensions import NotRequired

from envace_mcp.errors import UserError
from envace_mcp.graph import calls
from envace_mcp._sync import run_sync
from envace_mcp.graph.dropin import ToolCallRehearsal
from envace_mcp.graph.gate import GateConfig, Mode, RunLimits
from envace_mcp.graph.memory import render_memory
from envace_mcp.graph.nodes._stalls import stall
from envace_mcp.graph.state import RehearsalRecord, upsert_records
from envace_mcp.policy.base import Policy
from envace_mcp.policy.prompts import MEMORY_HEADER
from envace_mcp.policy.roles import with_world_model
from envace_mcp.policy.types import ToolCall

try:
    from langchain.agents.middleware import (AgentMiddleware, AgentState, ModelRequest, ModelResponse, ToolCallRequest,
                                             hook_config)
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    raise UserError("RehearsalMiddleware needs `langchain` (pip install 'envace-mcp[langchain]')") from exc


class RehearsalState(AgentState):
    """The agent's state plus rehearsal memory."""

    rehearsals: NotRequired[Annotated[list[RehearsalRecord], upsert_records]]
    stop_reason: NotRequired[str | None]
    """Why the agent's loop was ended without an answer (one call kept being stopped); None otherwise."""


class RehearsalMiddleware(AgentMiddleware):
    """Rehearse and gate each tool call of a `create_agent` agent."""

    state_schema = RehearsalState

    def __init__(self, policy: Policy, *, tools: list[Any] | None = None, gate: GateConfig | None = None,
                 limits: RunLimits | None = None, mode: Mode = "real",
                 approve: Callable[[calls.ApprovalRequest | calls.InputRequest], Any] | None = None,
                 memory: bool = True,
                 world_model: Any = None, trust_annotations: bool = True) -> None:
        """`world_model`: who rehearses, when not `policy` itself: the folder of a world model fitted to your
        tools (`envace world-model fit`; loaded on `policy`'s base model, its trust table read by the gate)
        or another policy (`roles.with_world_model`). `trust_annotations=False`: a LangChain tool's
        read-only / destructive hints (what an MCP server you do not control claims) are not believed, and
        every call to it waits for approval."""
        super().__init__()
        if world_model is not None:
            policy = with_world_model(policy, world_model)
        self.core = ToolCallRehearsal(policy, gate=gate, limits=limits, mode=mode, tools=tools, approve=approve,
                                      record_key="rehearsals", trust_annotations=trust_annotations)
        self.prerehearse = tools is not None
        self.memory = memory
        """Show the agent's model the rehearsal memory (as the EnvACE graph's act prompt does): a last
        message on each model call, never stored in the conversation."""

    def _with_memory(self, request: ModelRequest) -> ModelRequest:
        state = request.state if isinstance(request.state, dict) else {}
        text = render_memory(state.get("rehearsals") or []) if self.memory else None
        if not text:
            return request
        return request.override(messages=[*request.messages, HumanMessage(content=MEMORY_HEADER + text.strip())])

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        return handler(self._with_memory(request))

    async def awrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
                               ) -> ModelResponse:
        return await handler(self._with_memory(request))

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: Any, runtime: Runtime) -> dict[str, Any] | None:
        return _stop_if_stalled(state)

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: Any, runtime: Runtime) -> dict[str, Any] | None:
        return _stop_if_stalled(state)

    async def aafter_model(self, state: Any, runtime: Runtime) -> dict[str, Any] | None:
        state, update = _unique_ids(state)
        if self.prerehearse:
            records = await self.core.rehearse_turn(state, runtime)
            update.update({"rehearsals": records} if records else {})
        return update or None

    def after_model(self, state: Any, runtime: Runtime) -> dict[str, Any] | None:
        state, update = _unique_ids(state)
        if self.prerehearse:
            records = run_sync(self.core.rehearse_turn(state, runtime))
            update.update({"rehearsals": records} if records else {})
        return update or None

    async def awrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Any]],
                              ) -> ToolMessage | Command:
        return await self.core.awrap(request, handler)

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Any]) -> ToolMessage | Command:
        return self.core.wrap(request, handler)

    def describe(self, tool_call: dict[str, Any], state: Any, runtime: Runtime | None = None) -> str:
        """A `HumanInTheLoopMiddleware` description (`InterruptOnConfig["description"]`): the call and
        its rehearsed outcome, from this turn's rehearsal."""
        record = next((r for r in (state.get("rehearsals") or []) if r.get("call_id") == tool_call["id"]), {})
        call = ToolCall(id=tool_call["id"], name=tool_call["name"], arguments=tool_call["args"])
        p = calls.Proposal.from_record(call, self.core.specs.get(call.name), {"prediction": record.get("prediction")})
        return "Tool execution requires approval\n" + calls.describe(p)


def _stop_if_stalled(state: Any) -> dict[str, Any] | None:
    """End the loop (`jump_to: end`) once one call was stopped three times since the user's last message
    (`nodes._stalls`), saying why in `stop_reason`; clear an earlier request's reason otherwise."""
    if not isinstance(state, dict):
        return None
    stalled = stall(list(state.get("messages") or []))
    if stalled is not None:
        return {"jump_to": "end", "stop_reason": str(stalled)}
    return {"stop_reason": None} if state.get("stop_reason") else None


def _unique_ids(state: Any) -> tuple[Any, dict[str, Any]]:
    """The state with the last AI message's tool-call ids unique in the run (`calls.unique_ids`), and the
    update that puts the renamed message in place of the model's (same message id: `add_messages`
    replaces it) before any call is routed, rehearsed or approved."""
    messages = list(state.get("messages") or []) if isinstance(state, dict) else []
    if not messages or not isinstance(messages[-1], AIMessage) or not messages[-1].tool_calls or not messages[-1].id:
        return state, {}  # (a message without an id cannot be replaced; the core refuses its repeated ids)
    ai = messages[-1]
    fixed = calls.unique_ids(list(ai.tool_calls), calls.call_ids(messages[:-1]))
    if [c["id"] for c in fixed] == [c.get("id") for c in ai.tool_calls]:
        return state, {}
    renamed = ai.model_copy(update={"tool_calls": fixed})
    return {**state, "messages": [*messages[:-1], renamed]}, {"messages": [renamed]}
