"""act: one task per proposed call — execute it on the real server, answer it with its rehearsal
(simulated), ask a human, or explain why it was not run. Every path ends in a ToolMessage."""

from __future__ import annotations

import inspect
from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import interrupt
from typing_extensions import TypedDict

from envace_mcp.graph import calls
from envace_mcp.graph.calls import Proposal, RehearsalRecord
from envace_mcp.graph.state import EnvaceContext
from envace_mcp.policy.types import ToolCall


class ActInput(TypedDict):
    call: dict[str, Any]
    record: RehearsalRecord


async def act(payload: ActInput, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    ctx = await runtime.context.prepare()
    raw = payload["call"]
    call = ToolCall(id=raw["id"], name=raw["name"], arguments=raw["args"])
    p = Proposal.from_record(call, ctx.spec(call.name), payload["record"])
    decision = p.decision.action if p.decision else "execute"
    update: RehearsalRecord = {"call_id": call.id}
    if decision == "ask":
        approval = calls.read_approval(await ask(ctx, calls.approval_request(p)), call)
        update["approved"] = approval.approved
        if not approval.approved:
            update["decision"] = "rejected_by_human"
            return {"messages": [calls.rejected(call, approval)], "rehearsals": [update]}
        if approval.edited is not None:
            return await _edited(ctx, p, approval.edited, update)
        decision = "execute"
    if decision == "execute":
        result = await ctx.toolbox.call(call.name, call.arguments)
        update.update(calls.observed(p, result))
        return {"messages": [calls.reply(call, result.text, "error" if result.is_error else "success", result)],
                "rehearsals": [update], "real_calls": 1}
    if decision == "simulate":
        return {"messages": [calls.simulated_reply(call, p.prediction)]}
    return {"messages": [calls.refusal(p)]}


async def ask(ctx: EnvaceContext, request: calls.ApprovalRequest) -> Any:
    """The context's approver answers inside the run; without one, LangGraph's `interrupt()` pauses it."""
    if ctx.approve is None:
        return interrupt(request)
    answer = ctx.approve(request)
    return await answer if inspect.isawaitable(answer) else answer


async def _edited(ctx: EnvaceContext, p: Proposal, edited: ToolCall, update: RehearsalRecord) -> dict[str, Any]:
    """A human's edit runs instead of the proposed call, after the same argument checks."""
    update["edited"] = {"name": edited.name, "args": edited.arguments}
    check = calls.gate([Proposal(edited, ctx.spec(edited.name))], mode=ctx.mode, config=ctx.gate)[0]
    if check.decision is not None and check.decision.action == "reject":
        update["decision"] = "reject"
        return {"messages": [calls.refusal(check)], "rehearsals": [update]}
    result = await ctx.toolbox.call(edited.name, edited.arguments)
    update["real"] = result.model_dump(mode="json")  # no match score: the rehearsal was of another call
    return {"messages": [calls.reply(p.call, result.text, "error" if result.is_error else "success", result)],
            "rehearsals": [update], "real_calls": 1}
