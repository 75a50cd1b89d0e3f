"""gate: records the gate's decision for each proposed call (pure; see `envace_mcp.graph.gate`)."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import Send

from envace_mcp.graph.gate import decide
from envace_mcp.graph.nodes._common import last_ai
from envace_mcp.graph.state import EnvaceContext, EnvaceState
from envace_mcp.policy.types import Prediction, ToolCall


def gate(state: EnvaceState, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    ctx = runtime.context.ensure()
    message = last_ai(state["messages"])
    assert message is not None
    records = {r["call_id"]: r for r in state.get("rehearsals", [])}
    planned = 0
    decisions = []
    for raw in message.tool_calls:
        record = records.get(raw["id"], {})
        prediction = Prediction(**record["prediction"]) if record.get("prediction") else None
        decision = decide(ToolCall(id=raw["id"], name=raw["name"], arguments=raw["args"]), ctx.spec(raw["name"]),
                          prediction, mode=ctx.mode, config=ctx.gate, real_calls=state.get("real_calls", 0) + planned)
        planned += decision.action in ("execute", "ask")
        decisions.append({"call_id": raw["id"], "decision": decision.action, "reason": decision.reason})
    return {"rehearsals": decisions}


def route_calls(state: EnvaceState) -> list[Send]:
    """One `act` task per proposed call (so approvals and executions are independent on resume)."""
    message = last_ai(state["messages"])
    records = {r["call_id"]: r for r in state.get("rehearsals", [])}
    return [Send("act", {"call": raw, "record": records[raw["id"]]}) for raw in (message.tool_calls if message else [])]


# The graph's own nodes and routers are coroutines: LangGraph runs a plain function of an async graph
# in a worker thread, which cost a thread hop per step (benchmarks/graph_overhead.py).
async def gate_node(state: EnvaceState, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    await runtime.context.aensure()
    return gate(state, runtime)


async def route_calls_async(state: EnvaceState) -> list[Send]:
    return route_calls(state)

