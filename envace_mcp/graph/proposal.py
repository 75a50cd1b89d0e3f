"""A proposed call, typed: read once from the AI message into a `Proposal` that carries its `ToolCall`, its
catalog entry, its `Prediction` and the gate's `Decision` on its way through rehearse → gate → act. Graph
state keeps its JSON form (`Proposal.record`, a `RehearsalRecord`) for checkpointers; `Proposal.from_record`
reads it back."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage
from typing_extensions import TypedDict

from envace_mcp.graph.gate import Decision
from envace_mcp.policy.prompts import tool_call_text
from envace_mcp.policy.types import Example, Prediction, ToolCall
from envace_mcp.toolbox import ToolSpec


class RehearsalRecord(TypedDict, total=False):
    """Everything known about one proposed call (graph state's JSON form of a `Proposal`)."""

    call_id: str
    step: int
    tool: str
    arguments: Any
    prediction: dict[str, Any] | None
    """`Prediction.model_dump()`; `None` when the call was not rehearsed."""
    decision: str
    reason: str
    real: dict[str, Any] | None
    """`ToolResult.model_dump()` when the call ran on a real server."""
    match: float | None
    """Prediction-vs-reality score in [0, 1] when both exist (`policy.fidelity.compare`)."""
    status_match: bool | None
    """Whether the rehearsal predicted an error exactly when the tool erred (an unusable one: False)."""
    mismatches: list[str]
    approved: bool | None
    edited: dict[str, Any]
    """The call a human's edit ran instead (`{"name": ..., "args": ...}`)."""
    gated_spec: str
    """`spec_digest` of the catalog entry the gate judged: a call whose tool has changed since (a server
    restarted with another listing) is refused, not run under a decision made for another tool."""
    asked: list[dict[str, Any]]
    """Each round of questions the tool's server asked during the call, with what was answered:
    `{"round", "questions", "answers"}` (`answers` None: not answered, and `why`)."""



@dataclass(frozen=True)
class Proposal:
    """One proposed call on its way through rehearse → gate → act."""

    call: ToolCall
    spec: ToolSpec | None
    prediction: Prediction | None = None
    decision: Decision | None = None
    gated_spec: str | None = None
    """`spec_digest` of the entry the decision was made on (set by `gate`)."""
    position: tuple[int, int] | None = None
    """(index, count): which of the calls proposed together this is, where a person is asked about them
    one after another (a tool node's turn, `turn_order`); None where it is asked about alone."""

    @classmethod
    def from_record(cls, call: ToolCall, spec: ToolSpec | None, record: Mapping[str, Any]) -> Proposal:
        prediction = record.get("prediction")
        decision = Decision(record["decision"], record.get("reason", "")) if record.get("decision") else None  # type: ignore[arg-type]
        return cls(call, spec, Prediction.model_validate(prediction) if prediction else None, decision,
                   record.get("gated_spec"))

    def record(self, step: int | None = None) -> RehearsalRecord:
        out: RehearsalRecord = {"call_id": self.call.id, "tool": self.call.name, "arguments": self.call.arguments,
                                "prediction": self.prediction.model_dump(mode="json") if self.prediction else None}
        if step is not None:
            out["step"] = step
        if self.decision is not None:
            out["decision"], out["reason"] = self.decision.action, self.decision.reason
        if self.gated_spec is not None:
            out["gated_spec"] = self.gated_spec
        return out

    @property
    def tool_changed(self) -> bool:
        """Whether the catalog entry is no longer the one the gate judged."""
        return self.gated_spec is not None and self.gated_spec != spec_digest(self.spec)


def spec_digest(spec: ToolSpec | None) -> str:
    """The identity of the tool a decision was made on: `ToolSpec.behaviour` (server, remote tool, annotations,
    schemas), the one identity of a tool: what the toolbox checks before it runs a call (`ToolSpec.same_tool`)
    and what a trust table or a rules file is bound to. Everything the gate's decision reads of a tool is in
    it; a catalog name or a description that changed alone does not make it another tool. "none": no tool."""
    return "none" if spec is None else spec.behaviour


def tool_calls(message: AIMessage) -> list[ToolCall]:
    """The message's calls, typed (the one place they are read from LangChain's dicts)."""
    return [ToolCall(id=c["id"] or "", name=c["name"], arguments=c["args"]) for c in message.tool_calls]


def call_ids(messages: Iterable[Any]) -> list[str]:
    """Every tool-call id the AI messages of a conversation carry, repeats included."""
    return [c.get("id") or "" for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]


def unique_ids(calls: list[dict[str, Any]], taken: Iterable[str]) -> list[dict[str, Any]]:
    """`calls` (LangChain tool-call dicts) with every id unique among themselves and `taken` (the run's
    earlier ids): some models repeat ids (`call_1` for a transfer and a read), and an id shared by two
    calls lets one call's approval, record or reply stand for the other's. A repeated or empty id gets
    a fresh one; ids already unique are kept."""
    seen = set(taken)
    out = []
    for call in calls:
        given = call.get("id") or ""
        if not given or given in seen:
            given = f"{given or 'call'}_{uuid.uuid4().hex[:8]}"
        seen.add(given)
        out.append({**call, "id": given})
    return out


def repeated_id(call: ToolCall, messages: Iterable[Any]) -> bool:
    """Whether another proposed call of the conversation shares `call`'s id (or it has none)."""
    return not call.id or call_ids(messages).count(call.id) > 1


def proposals(message: AIMessage, specs: Mapping[str, ToolSpec]) -> list[Proposal]:
    return [Proposal(call, specs.get(call.name)) for call in tool_calls(message)]


def raw_act_message(message: AIMessage) -> str:
    """The act turn as the model wrote it (for the rehearse role's prompt)."""
    parts = [str(message.content or "")] + [tool_call_text(c["name"], c["args"]) for c in message.tool_calls]
    return "\n".join(p for p in parts if p)


def examples_from(records: list[RehearsalRecord], limit: int = 6) -> list[Example]:
    """Real calls made earlier in this run, as few-shot examples for the simulator (EnvACE)."""
    out = []
    for record in records:
        real = record.get("real")
        if real is not None and not real.get("is_error"):
            text = "".join(b.get("text", "") for b in real.get("content", []) if b.get("type") == "text")
            out.append(Example(tool=record["tool"], arguments=record.get("arguments"), result=text))
