"""What the drop-ins share: running the graph's own nodes on one AI message outside the EnvACE graph."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from envace_mcp.errors import UserError
from envace_mcp.graph.nodes.act import act
from envace_mcp.graph.nodes.gate import gate
from envace_mcp.graph.nodes.rehearse import rehearse
from envace_mcp.graph.state import EnvaceContext, RehearsalRecord, upsert_records
from envace_mcp.policy.fidelity import compare
from envace_mcp.policy.types import Prediction
from envace_mcp.toolbox import ToolAnnotations, ToolResult, ToolSpec


def spec_from_tool(tool: Any) -> ToolSpec:
    """A catalog entry for any LangChain tool (ours carry MCP annotations in `metadata`)."""
    metadata = getattr(tool, "metadata", None) or {}
    schema = tool.args_schema if isinstance(tool.args_schema, dict) else tool.tool_call_schema.model_json_schema()
    return ToolSpec.create(remote_name=tool.name, server=str(metadata.get("server", "langchain")),
                           description=tool.description, input_schema=schema,
                           output_schema=metadata.get("output_schema"),
                           annotations=ToolAnnotations.from_hints(
                               {f"{k}_hint": v for k, v in (metadata.get("annotations") or {}).items()} or None))


async def rehearse_gate_act(context: EnvaceContext, messages: list[Any], ai: AIMessage,
                            history: list[RehearsalRecord] | None = None,
                            execute: Any = None) -> tuple[list[ToolMessage], list[RehearsalRecord]]:
    """Rehearse, gate and run the calls of `ai`; `execute(call)` overrides how approved calls run."""
    if context.gate.require_approval != "never" or context.gate.approve_blocked:
        raise UserError("human approval needs the EnvACE graph (create_envace_graph): a drop-in node re-runs "
                        "whole on resume, which would rehearse and execute again")
    runtime = SimpleNamespace(context=context, stream_writer=_stream_writer())
    state: dict[str, Any] = {"messages": [*messages, ai], "rehearsals": list(history or []), "steps": 0,
                             "real_calls": 0, "rehearsal_count": 0}
    update = await rehearse(state, runtime)  # type: ignore[arg-type]
    state["rehearsals"] = upsert_records(state["rehearsals"], update["rehearsals"])
    decided = gate(state, runtime)  # type: ignore[arg-type]
    records = upsert_records(state["rehearsals"], decided["rehearsals"])
    by_id = {r["call_id"]: r for r in records}

    async def one(call: dict[str, Any]) -> dict[str, Any]:
        record = by_id[call["id"]]
        if execute is not None and record["decision"] == "execute":
            reply = await execute(call)
            return {"messages": [reply], "rehearsals": [_observed(call, record, reply)], "real_calls": 1}
        return await act({"call": call, "record": record}, runtime)  # type: ignore[arg-type]

    outputs = await asyncio.gather(*(one(c) for c in ai.tool_calls))
    replies = [m for out in outputs for m in out["messages"]]
    for out in outputs:
        records = upsert_records(records, out.get("rehearsals"))
    new = {c["id"] for c in ai.tool_calls}
    mine = [r for r in records if r["call_id"] in new]
    for reply in replies:
        reply.additional_kwargs["envace_rehearsal"] = next(r for r in mine if r["call_id"] == reply.tool_call_id)
    return replies, mine


def _stream_writer() -> Any:
    """The running graph's `custom` stream (trace recorders read generations there), if any."""
    try:
        from langgraph.config import get_stream_writer

        return get_stream_writer()
    except (RuntimeError, ImportError):
        return None


def _observed(call: dict[str, Any], record: RehearsalRecord, reply: Any) -> RehearsalRecord:
    """The record of a call a foreign tool executed: its real outcome and the prediction's score."""
    if not isinstance(reply, ToolMessage):
        return {"call_id": call["id"]}
    artifact = reply.artifact if isinstance(reply.artifact, ToolResult) else None
    real = artifact or ToolResult(tool=call["name"], content=[{"type": "text", "text": str(reply.content)}],
                                  is_error=reply.status == "error")
    update: RehearsalRecord = {"call_id": call["id"], "real": real.model_dump(mode="json")}
    if record.get("prediction"):
        match = compare(Prediction(**record["prediction"]), real)
        update["match"], update["mismatches"] = match.score, match.mismatches
    return update
