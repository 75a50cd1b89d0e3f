"""The replies the agent gets for a call: the tool's own, the rehearsal standing in for it, or why it did
not run (marked `NOT_EXECUTED`, so the rehearse role never takes them for a tool's reply); and the record
fields of a call that ran."""

from __future__ import annotations

import json
from typing import Any, Literal

from langchain_core.messages import ToolMessage

from envace_mcp.graph.approval import Approval
from envace_mcp.graph.proposal import Proposal, RehearsalRecord
from envace_mcp.policy.fidelity import compare
from envace_mcp.policy.prompts import NOT_EXECUTED
from envace_mcp.policy.types import Prediction, ToolCall
from envace_mcp.toolbox import ToolResult


def reply(call: ToolCall, content: str, status: Literal["success", "error"], artifact: Any = None,
          not_executed: str | None = None) -> ToolMessage:
    """A tool message for `call`; `not_executed` (the gate's action) marks a reply the tool never gave,
    which the rehearse role does not see (`prompts.observations_only`)."""
    extra = {NOT_EXECUTED: not_executed} if not_executed else {}
    return ToolMessage(content=content, tool_call_id=call.id, name=call.name, status=status, artifact=artifact,
                       additional_kwargs=extra)


def simulated_reply(call: ToolCall, prediction: Prediction | None) -> ToolMessage:
    """The rehearsal standing in for the tool (simulated and mixed modes)."""
    if prediction is None:
        return reply(call, "Error: no rehearsal was available to simulate this call (rehearsal budget spent)", "error")
    if prediction.status == "result":  # an inline rehearsal's own text: the trajectory continues its tokens
        return reply(call, prediction.text if prediction.text is not None else json.dumps(prediction.result, ensure_ascii=False),
                     "success", prediction.model_dump())
    if prediction.status == "tool_error":
        text = prediction.text if prediction.text is not None else json.dumps(
            prediction.result or {"error_tool_call": {"code": prediction.code}}, ensure_ascii=False)
        return reply(call, text, "error", prediction.model_dump())
    return reply(call, f"Error: the simulated tool failed ({prediction.code}: {prediction.message})", "error",
                 prediction.model_dump())


def refusal(p: Proposal) -> ToolMessage:
    """Why the gate did not run a call, with the rehearsed outcome when there is one."""
    assert p.decision is not None
    outcome = ""
    if p.prediction is not None and p.prediction.status != "invalid":
        outcome = f" Rehearsed outcome: {json.dumps(p.prediction.result, ensure_ascii=False)[:400]}"
    return reply(p.call, f"Not executed ({p.decision.action}): {p.decision.reason}.{outcome}", "error",
                 not_executed=p.decision.action)


def rejected(call: ToolCall, approval: Approval) -> ToolMessage:
    why = f" Reason: {approval.message}" if approval.message else ""
    return reply(call, f"Not executed: the call was not approved.{why}", "error", not_executed="rejected")


def unanswered(call: ToolCall, why: str) -> ToolMessage:
    return reply(call, f"Not finished: the tool asked for input and got no answer. Reason: {why}", "error",
                 not_executed="rejected")


def observed(p: Proposal, result: ToolResult) -> RehearsalRecord:
    """The record fields of a call that ran: its real outcome, and how well rehearsal predicted it."""
    update: RehearsalRecord = {"call_id": p.call.id, "real": result.model_dump(mode="json")}
    if p.prediction is not None:
        match = compare(p.prediction, result)
        update["match"], update["status_match"], update["mismatches"] = match.score, match.status_match, match.mismatches
    return update


def result_of(call: ToolCall, message: Any) -> ToolResult | None:
    """The real outcome a foreign tool's reply carries (our MCP tools put the `ToolResult` in the artifact)."""
    if not isinstance(message, ToolMessage):
        return None
    if isinstance(message.artifact, ToolResult):
        return message.artifact
    return ToolResult(tool=call.name, content=[{"type": "text", "text": str(message.content)}],
                      is_error=message.status == "error")
