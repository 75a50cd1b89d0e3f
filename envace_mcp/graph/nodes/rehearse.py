"""rehearse: the rehearse role predicts each proposed call's outcome (concurrently, so a batching
backend generates them together); predictions are appended to rehearsal memory."""

from __future__ import annotations

import asyncio
from typing import Any

from langgraph.runtime import Runtime

from envace_mcp.graph.gate import should_rehearse
from envace_mcp.graph.nodes._common import emit, last_ai
from envace_mcp.graph.nodes.agent import raw_act_message
from envace_mcp.graph.state import EnvaceContext, EnvaceState, RehearsalRecord
from envace_mcp.policy.types import Example, RehearseRequest, ToolCall


def examples_from(records: list[RehearsalRecord], limit: int = 6) -> list[Example]:
    """Real calls made earlier in this run, as few-shot examples for the simulator (EnvACE)."""
    out = []
    for record in records:
        real = record.get("real")
        if real is not None and not real.get("is_error"):
            text = "".join(b.get("text", "") for b in real.get("content", []) if b.get("type") == "text")
            out.append(Example(tool=record["tool"], arguments=record.get("arguments"), result=text))
    return out[-limit:]


async def rehearse(state: EnvaceState, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    ctx = await runtime.context.aensure()
    message = last_ai(state["messages"])
    assert message is not None and message.tool_calls
    step = state.get("steps", 0)
    budget = ctx.gate.max_rehearsals
    used = state.get("rehearsal_count", 0)
    records: list[RehearsalRecord] = []
    jobs = []
    catalog = ctx.catalog()
    examples = examples_from(state.get("rehearsals", []))
    for raw in message.tool_calls:
        call = ToolCall(id=raw["id"], name=raw["name"], arguments=raw["args"])
        spec = ctx.spec(call.name)
        record: RehearsalRecord = {"call_id": call.id, "step": step, "tool": call.name, "arguments": call.arguments,
                                   "prediction": None}
        records.append(record)
        if should_rehearse(spec, ctx.mode, ctx.gate) and (budget is None or used + len(jobs) < budget):
            request = RehearseRequest(call=call, tool=spec, allowed=catalog, history=list(state["messages"][:-1]),
                                      act_message=raw_act_message(message), examples=examples)
            jobs.append((record, request))
    generations = await asyncio.gather(*(ctx.policy.rehearse(req, ctx.sampling.get("rehearse")) for _, req in jobs))
    for (record, _), generation in zip(jobs, generations):
        record["prediction"] = generation.parsed.model_dump(mode="json")
        emit(runtime, "rehearse", generation, call_id=record["call_id"])
    return {"rehearsals": records, "rehearsal_count": len(jobs)}
