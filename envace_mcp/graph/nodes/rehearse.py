"""rehearse: the rehearse role predicts each proposed call's outcome (concurrently, so a batching
backend generates them together); predictions are appended to rehearsal memory."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from envace_mcp.graph import calls
from envace_mcp.graph.nodes._common import act_request, emit, last_ai
from envace_mcp.graph.state import EnvaceContext, EnvaceState


async def rehearse(state: EnvaceState, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    ctx = await runtime.context.prepare()
    message = last_ai(state["messages"])
    assert message is not None and message.tool_calls
    budget = ctx.limits.max_rehearsals
    catalog = ctx.catalog()
    rehearsed, generations = await calls.rehearse(
        calls.proposals(message, {s.name: s for s in catalog}), policy=ctx.policy, catalog=catalog,
        history=list(state["messages"][:-1]), act_message=calls.raw_act_message(message), mode=ctx.mode,
        config=ctx.gate, examples=calls.examples_from(state.get("rehearsals", [])), sampling=ctx.sampling.get("rehearse"),
        budget=None if budget is None else budget - state.get("rehearsal_count", 0),
        context=act_request(state, ctx, state["messages"][:-1]))
    for p, generation in zip(rehearsed, generations):
        if generation is not None:
            emit(runtime, "rehearse", generation, call_id=p.call.id)
    step = state.get("steps", 0)
    return {"rehearsals": [p.record(step) for p in rehearsed],
            "rehearsal_count": sum(g is not None for g in generations)}
