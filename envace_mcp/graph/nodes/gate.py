"""gate: records the gate's decision for each proposed call (pure; see `envace_mcp.graph.gate`); a call
stopped for the `REPEATED_STOPS`-th time since the user's last message says so in its reason."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.runtime import Runtime
from langgraph.types import Send

from envace_mcp.graph import calls
from envace_mcp.graph.nodes._common import last_ai
from envace_mcp.graph.nodes._stalls import mark_repeats
from envace_mcp.graph.state import EnvaceContext, EnvaceState


def gate(state: EnvaceState, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    ctx = runtime.context
    message = last_ai(state["messages"])
    assert message is not None
    specs = {s.name: s for s in ctx.catalog()}
    records = {r["call_id"]: r for r in state.get("rehearsals", [])}
    proposed = [calls.Proposal.from_record(c, specs.get(c.name), records.get(c.id, {})) for c in calls.tool_calls(message)]
    decided = calls.gate(proposed, mode=ctx.mode, config=ctx.gate, real_calls=state.get("real_calls", 0),
                         max_real_calls=ctx.limits.max_real_calls,
                         messages=_with_task(state), specs=specs)
    decided = mark_repeats(state["messages"], decided)
    return {"rehearsals": [{"call_id": p.call.id, "decision": p.decision.action, "reason": p.decision.reason,
                            "gated_spec": p.gated_spec} for p in decided if p.decision is not None]}


def _with_task(state: EnvaceState) -> list[Any]:
    """The conversation, led by the task when the state holds it apart (the evidence rules read it)."""
    task = state.get("task")
    return ([HumanMessage(content=task)] if task else []) + list(state["messages"])


def route_calls(state: EnvaceState) -> list[Send]:
    """One `act` task per proposed call (so approvals and executions are independent on resume)."""
    message = last_ai(state["messages"])
    records = {r["call_id"]: r for r in state.get("rehearsals", [])}
    return [Send("act", {"call": raw, "record": records[raw["id"]]}) for raw in (message.tool_calls if message else [])]


# The graph's own nodes and routers are coroutines: LangGraph runs a plain function of an async graph
# in a worker thread, which cost a thread hop per step (benchmarks/graph_overhead.py).
async def gate_node(state: EnvaceState, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    await runtime.context.prepare()
    return gate(state, runtime)


async def route_calls_async(state: EnvaceState) -> list[Send]:
    return route_calls(state)
