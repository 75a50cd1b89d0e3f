"""act: one task per proposed call — execute it on the real server, answer it with its rehearsal
(simulated), ask a human, or explain why it was not run (`graph.acting`, the act phase every form
runs). Every path ends in a ToolMessage."""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import interrupt
from typing_extensions import TypedDict

from envace_mcp.graph import calls
from envace_mcp.graph.acting import act_async
from envace_mcp.graph.calls import Proposal, RehearsalRecord
from envace_mcp.graph.state import EnvaceContext
from envace_mcp.policy.types import ToolCall
from envace_mcp.toolbox import ToolResult, ToolSpec


class ActInput(TypedDict):
    call: dict[str, Any]
    record: RehearsalRecord


async def act(payload: ActInput, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    ctx = await runtime.context.prepare()
    raw = payload["call"]
    call = ToolCall(id=raw["id"], name=raw["name"], arguments=raw["args"])
    recorded = Proposal.from_record(call, ctx.spec(call.name), payload["record"])
    # checked again here: the record comes from graph state, which an API caller can write (a Command
    # sent straight to `act`, an update_state), so it can tighten what runs, never loosen it
    checked = calls.gate([replace(recorded, decision=None)], mode=ctx.mode, config=ctx.gate)[0]
    p = replace(recorded, decision=calls.stricter(recorded.decision, checked.decision))

    def regate(edited: ToolCall) -> Proposal:
        return calls.gate([Proposal(edited, ctx.spec(edited.name))], mode=ctx.mode, config=ctx.gate)[0]

    async def run(target: ToolCall, spec: ToolSpec | None) -> ToolResult:
        return await call_tool(ctx.toolbox, target, spec)

    acted = await act_async(p, ask=lambda request: ask(ctx, request), run=run, regate=regate,
                            sent=lambda target: calls.arguments_sent(ctx.toolbox, target))
    return {"messages": [acted.reply], "rehearsals": [acted.record], **({"real_calls": 1} if acted.ran else {})}


async def ask(ctx: EnvaceContext, request: calls.ApprovalRequest) -> Any:
    """The context's approver answers inside the run; without one, LangGraph's `interrupt()` pauses it."""
    if ctx.approve is None:
        return interrupt(request)
    answer = ctx.approve(request)
    return await answer if inspect.isawaitable(answer) else answer


async def call_tool(backend: Any, call: ToolCall, spec: ToolSpec | None) -> ToolResult:
    """Run `call` on the backend, routed only to the catalog entry the gate judged (`expect`): a backend
    that takes no `expect` (one of your own) is called as before."""
    if "expect" in inspect.signature(backend.call).parameters:
        return await backend.call(call.name, call.arguments, expect=spec)
    return await backend.call(call.name, call.arguments)
