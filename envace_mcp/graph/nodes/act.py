"""act: one task per proposed call — execute it on the real server, answer it with its rehearsal
(simulated), ask a human, or explain why it was not run. Every path ends in a ToolMessage."""

from __future__ import annotations

import inspect
import json
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.runtime import Runtime
from langgraph.types import interrupt
from typing_extensions import TypedDict

from envace_mcp.graph.state import ApprovalRequest, EnvaceContext, RehearsalRecord
from envace_mcp.policy.fidelity import compare
from envace_mcp.policy.types import Prediction


class ActInput(TypedDict):
    call: dict[str, Any]
    record: RehearsalRecord


def approved(answer: Any) -> bool:
    """What counts as a yes when resuming an approval interrupt."""
    if isinstance(answer, dict):
        return bool(answer.get("approved"))
    if isinstance(answer, str):
        return answer.strip().lower() in {"y", "yes", "approve", "approved", "ok"}
    return answer is True


def _message(call: dict[str, Any], content: str, status: str, artifact: Any = None) -> ToolMessage:
    return ToolMessage(content=content, tool_call_id=call["id"], name=call["name"], status=status, artifact=artifact)


def simulated_reply(call: dict[str, Any], prediction: Prediction | None) -> ToolMessage:
    """The rehearsal standing in for the tool (simulated and mixed modes)."""
    if prediction is None:
        return _message(call, "Error: no rehearsal was available to simulate this call (rehearsal budget spent)", "error")
    if prediction.status == "result":
        return _message(call, json.dumps(prediction.result, ensure_ascii=False), "success", prediction.model_dump())
    if prediction.status == "tool_error":
        return _message(call, json.dumps(prediction.result or {"error_tool_call": {"code": prediction.code}},
                                         ensure_ascii=False), "error", prediction.model_dump())
    return _message(call, f"Error: the simulated tool failed ({prediction.code}: {prediction.message})", "error",
                    prediction.model_dump())


async def act(payload: ActInput, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    ctx = await runtime.context.aensure()
    call, record = payload["call"], payload["record"]
    prediction = Prediction(**record["prediction"]) if record.get("prediction") else None
    decision = record.get("decision", "execute")
    update: RehearsalRecord = {"call_id": call["id"]}
    if decision == "ask":
        request: ApprovalRequest = {"call": {"name": call["name"], "arguments": call["args"]},
                                    "rehearsal": record.get("prediction"), "reason": record.get("reason"),
                                    "question": "Run this call? Resume with True/'yes' or False/'no'."}
        if ctx.approve is not None:
            answer = ctx.approve(request)
            if inspect.isawaitable(answer):
                answer = await answer
        else:
            answer = interrupt(request)
        update["approved"] = approved(answer)
        if not update["approved"]:
            update["decision"] = "rejected_by_human"
            return {"messages": [_message(call, "Not executed: a human rejected this call.", "error")],
                    "rehearsals": [update]}
        decision = "execute"
    if decision == "execute":
        result = await ctx.toolbox.call(call["name"], call["args"])
        update["real"] = result.model_dump(mode="json")
        if prediction is not None:
            match = compare(prediction, result)
            update["match"], update["mismatches"] = match.score, match.mismatches
        return {"messages": [_message(call, result.text, "error" if result.is_error else "success", result)],
                "rehearsals": [update], "real_calls": 1}
    if decision == "simulate":
        return {"messages": [simulated_reply(call, prediction)]}
    outcome = ""
    if prediction is not None and prediction.status != "invalid":
        outcome = f" Rehearsed outcome: {json.dumps(prediction.result, ensure_ascii=False)[:400]}"
    return {"messages": [_message(call, f"Not executed ({decision}): {record.get('reason', '')}.{outcome}", "error")]}
