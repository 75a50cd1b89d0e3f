"""The rehearse → gate core, on typed calls: what the graph's nodes and the drop-ins all run.

A proposed call is read from the AI message once (`proposals`), into a `Proposal` that carries its
`ToolCall`, its catalog entry, its `Prediction` and the gate's `Decision` on its way through
rehearse → gate → act. Graph state keeps the JSON form (`Proposal.record`, a `RehearsalRecord`) for
checkpointers; `Proposal.from_record` reads it back.

Approvals use LangChain's human-in-the-loop shapes, so LangGraph Studio and Agent Inbox-style UIs
render them: the request is a `ToolApprovalRequest` (`type: "tool_approval"`, the call, a description
with the rehearsed outcome) and the answer a decision (`{"type": "approve"}`, `{"type": "reject",
"message": ...}`, `{"type": "edit", "edited_action": {"name": ..., "args": ...}}`); `True` / `"yes"`
still mean approve. A tool whose server asks for input mid-call is asked about in the same shape
(`InputRequest`, `type: "tool_input"`) and answered with `{"type": "respond", "responses": {key: answer}}`.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from typing_extensions import NotRequired, TypedDict

from envace_mcp._text import key_text, visible
from envace_mcp.graph.gate import Decision, Evidence, GateConfig, Mode, decide, should_rehearse
from envace_mcp.policy.base import Policy
from envace_mcp.policy.fidelity import compare
from envace_mcp.policy.prompts import NOT_EXECUTED, tool_call_text
from envace_mcp.policy.types import ActRequest, Example, Generation, Prediction, RehearseRequest, SamplingParams, ToolCall
from envace_mcp.toolbox import ToolResult, ToolSpec
from envace_mcp.toolbox.asking import Answer, AskingError, Question, read_answers
from envace_mcp.traces.context import RUN_ID, traceparent


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


class ApprovalRequest(TypedDict):
    """What a human (or `EnvaceContext.approve`) is shown for a call the gate wants approved: LangChain's
    `ToolApprovalRequest` (one call per request) plus the rehearsal it was gated on."""

    type: Literal["tool_approval"]
    tool_call_id: str
    name: str
    args: Any
    description: str
    """The reason and the rehearsed outcome, for the reviewer to read."""
    rehearsal: NotRequired[dict[str, Any] | None]
    """The rehearsed outcome (`Prediction.model_dump()`), `None` when not rehearsed."""
    reason: NotRequired[str | None]


class InputRequest(TypedDict):
    """What a person (or `EnvaceContext.approve`) is shown when a running call's server asks for input:
    the approval request's shape, with the server's questions (`toolbox.asking.Question`)."""

    type: Literal["tool_input"]
    tool_call_id: str
    name: str
    args: Any
    description: str
    """The call, the questions (escaped) and the rehearsed outcome, for the person to read."""
    questions: list[Question]
    round: int
    rehearsal: NotRequired[dict[str, Any] | None]
    problem: NotRequired[str]
    """Why the last answers to these questions could not be used; present only when asked again."""


@dataclass(frozen=True)
class Approval:
    """A human's answer to an `ApprovalRequest`."""

    approved: bool
    message: str | None = None
    """A rejection's reason, for the agent."""
    edited: ToolCall | None = None
    """The call to run instead (an `edit` decision)."""


@dataclass(frozen=True)
class Proposal:
    """One proposed call on its way through rehearse → gate → act."""

    call: ToolCall
    spec: ToolSpec | None
    prediction: Prediction | None = None
    decision: Decision | None = None
    gated_spec: str | None = None
    """`spec_digest` of the entry the decision was made on (set by `gate`)."""

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
    """A catalog entry's identity as the gate judges it: server, names, description, schemas, annotations."""
    return "none" if spec is None else spec.digest


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
    return out[-limit:]


async def rehearse(
    items: list[Proposal],
    *,
    policy: Policy,
    catalog: list[ToolSpec],
    history: list[AnyMessage],
    act_message: str,
    mode: Mode,
    config: GateConfig,
    examples: list[Example] | None = None,
    sampling: SamplingParams | None = None,
    budget: int | None = None,
    context: ActRequest | None = None,
) -> tuple[list[Proposal], list[Generation[Prediction] | None]]:
    """Predict the outcome of every call the gate's rule rehearses, concurrently (a batching backend
    generates them together), at most `budget` of them. Returns the proposals with their predictions
    and each one's generation (`None`: not rehearsed), for trace recorders. `context`: the act request
    of the turn that proposed the calls (what an inline rehearsal continues)."""
    picked = [i for i, p in enumerate(items) if should_rehearse(p.spec, mode, config)]
    if budget is not None:
        picked = picked[: max(budget, 0)]
    requests = [RehearseRequest(call=items[i].call, tool=items[i].spec, allowed=catalog, history=history,
                                act_message=act_message, examples=list(examples or []), context=context)
                for i in picked]
    generations = await asyncio.gather(*(policy.rehearse(r, sampling) for r in requests))
    out: list[Generation[Prediction] | None] = [None] * len(items)
    done = list(items)
    for i, generation in zip(picked, generations):
        out[i] = generation
        prediction = generation.parsed
        if generation.logprobs and prediction is not None and prediction.confidence is None:
            prediction = prediction.model_copy(update={"confidence": math.exp(generation.logprobs[0])})
        done[i] = replace(items[i], prediction=prediction)
    return done, out


def gate(items: list[Proposal], *, mode: Mode, config: GateConfig, real_calls: int = 0,
         max_real_calls: int | None = None, messages: list[AnyMessage] | None = None,
         specs: Mapping[str, ToolSpec] | None = None) -> list[Proposal]:
    """The gate's decision for each call; calls it would run count against the real-call budget
    (`max_real_calls`, None: none) in order. `messages` (the conversation so far) and `specs` feed the
    evidence rules (`gate.Evidence`)."""
    evidence = None
    if messages is not None and config.reads_evidence:
        evidence = Evidence.of(messages, {name: s.annotations.read_only for name, s in (specs or {}).items()})
    out = []
    for p in items:
        decision = decide(p.call, p.spec, p.prediction, mode=mode, config=config, real_calls=real_calls,
                          max_real_calls=max_real_calls, evidence=evidence)
        real_calls += decision.action in ("execute", "ask")
        out.append(replace(p, decision=decision, gated_spec=spec_digest(p.spec)))
    return out


_NOT_RUN = ("reject", "simulate", "feedback", "block", "budget")


def stricter(recorded: Decision | None, checked: Decision) -> Decision:
    """The stricter of two decisions on one call: any that does not run it, then `ask`, then `execute`.
    The act node checks a call again before running it, since a decision read from graph state may have
    been written by whoever can update that state (a served graph's API caller)."""
    if recorded is None:
        return checked
    for decision in (recorded, checked):
        if decision.action in _NOT_RUN:
            return decision
    return recorded if recorded.action == "ask" or checked.action != "ask" else checked


# ------------------------------------------------------------------ approvals

def approval_request(p: Proposal, sent: Any = None) -> ApprovalRequest:
    """The request for `p`; `sent`: the arguments the server will receive when they differ from the call's
    (a scope's bound arguments, `arguments_sent`): those are what is shown and approved."""
    reason = p.decision.reason if p.decision else None
    rehearsal = p.prediction.model_dump(mode="json") if p.prediction else None
    args = p.call.arguments if sent is None else sent
    return {"type": "tool_approval", "tool_call_id": p.call.id, "name": p.call.name, "args": args,
            "description": describe(p, args), "rehearsal": rehearsal, "reason": reason}


def arguments_sent(backend: Any, call: ToolCall) -> Any:
    """The arguments `backend` will send for `call` (a `ToolboxScope` adds its bound ones); the call's own
    for a backend that changes none."""
    adds = getattr(backend, "arguments_sent", None)
    return adds(call.name, call.arguments) if callable(adds) else call.arguments


def describe(p: Proposal, arguments: Any = None) -> str:
    """What a reviewer reads: the call with every argument the server will receive, whole (`call_text`),
    why it needs approval, and what rehearsal predicts it will return. Plain text with control characters
    shown (`visible`)."""
    lines = [call_text(p.call.name, p.call.arguments if arguments is None else arguments)]
    if p.decision is not None:
        lines.append(f"Why: {visible(p.decision.reason)}")
    lines.append(f"Rehearsed outcome: {outcome_text(p.prediction)}")
    return "\n".join(lines)


SHORT_CALL = 100
"""A call whose text is at most this long is shown on one line; a longer one, one argument per line."""


def call_text(name: str, arguments: Any) -> str:
    """A call as a reviewer must see it: every argument the server will receive, whole, never cut (a
    memo long enough to push the destination off a cut line was approved unseen), one per line when
    the call is long, each value as JSON with control characters shown (`visible`)."""
    one_line = visible(f"{name}({json.dumps(arguments, ensure_ascii=False, default=str)})")
    if len(one_line) <= SHORT_CALL or not isinstance(arguments, dict) or not arguments:
        return one_line
    rows = [f"  {key_text(key)}: {visible(json.dumps(value, ensure_ascii=False, default=str))}"
            for key, value in arguments.items()]
    return "\n".join([f"{visible(name)}(", *rows, ")"])


def outcome_text(prediction: Prediction | None) -> str:
    """The rehearsed outcome in words, whole, control characters shown."""
    if prediction is None:
        return "not rehearsed"
    sure = f", P(error) {prediction.p_error:.2f}" if prediction.p_error is not None else ""
    if prediction.status == "result":
        cut = " (cut at the rehearsal's token budget: what follows is unknown)" if prediction.code == "CUT" else ""
        return visible(f"succeeds{sure}, returning {json.dumps(prediction.result, ensure_ascii=False)}{cut}")
    if prediction.status == "tool_error":
        return visible(f"fails ({prediction.code}: {prediction.message or prediction.details or 'error'}){sure}")
    wrote = f"; it wrote: {prediction.text}" if prediction.text else ""
    return visible(f"could not be read ({prediction.message or prediction.code}): it predicts nothing{wrote}")


def read_approval(answer: Any, call: ToolCall) -> Approval:
    """A resume value or an approver's return, in any of the accepted shapes (LangChain's
    `{"decisions": [decision]}` resume too, with exactly one decision). Anything else is a "no"."""
    if isinstance(answer, Mapping) and "decisions" in answer:
        decisions = answer.get("decisions")
        answer = decisions[0] if isinstance(decisions, list) and len(decisions) == 1 else None
    if isinstance(answer, Mapping):
        kind = answer.get("type")
        if kind == "approve":
            return Approval(True)
        if kind == "reject":
            message = answer.get("message")
            return Approval(False, message if isinstance(message, str) else None)
        if kind == "edit":
            edited = answer.get("edited_action")
            name = edited.get("name", call.name) if isinstance(edited, Mapping) else None
            if not isinstance(name, str):  # an edit that names no call runs nothing
                return Approval(False, "the edit named no call to run")
            return Approval(True, edited=ToolCall(id=call.id, name=name, arguments=edited.get("args", call.arguments)))
        return Approval(answer.get("approved") is True)
    if isinstance(answer, str):
        return Approval(answer.strip().lower() in {"y", "yes", "approve", "approved", "ok"})
    return Approval(answer is True)


def input_request(p: Proposal, questions: list[Question], round: int, sent: Any = None,
                  problem: str | None = None) -> InputRequest:
    """The request for the questions a running call's server asked (round `round`); `problem`: why the
    last answers to them could not be used (the request then asks again, saying so)."""
    args = p.call.arguments if sent is None else sent
    lines = [call_text(p.call.name, args), f"The tool asks (round {round}):"]
    for q in questions:
        lines.append(f"- {key_text(q['key'])}: {visible(q['message'], newlines=False)}")
        if q["mode"] == "url":
            lines.append(f"  visit: {visible(q['url'])}")
        else:
            fields = (q.get("requested_schema") or {}).get("properties") or {}
            lines += [f"  {key_text(name)}: {visible(str(field.get('type')))}"
                      + (f", one of {visible(json.dumps(field['enum'], ensure_ascii=False))}" if "enum" in field else "")
                      for name, field in fields.items()]
    lines.append(f"Rehearsed outcome: {outcome_text(p.prediction)}")
    if problem:
        lines.append(f"Asked again: {visible(problem)}")
    return {"type": "tool_input", "tool_call_id": p.call.id, "name": p.call.name, "args": args,
            "description": "\n".join(lines), "questions": questions, "round": round,
            "rehearsal": p.prediction.model_dump(mode="json") if p.prediction else None,
            **({"problem": problem} if problem else {})}


@dataclass(frozen=True)
class InputAnswer:
    """A person's answer to an `InputRequest`: the responses, or why there are none."""

    responses: dict[str, Answer] | None
    why: str | None = None
    unusable: bool = False
    """Answers were given that do not fit the questions (a wrong key, a value the form refuses): the
    person is asked again, told why, rather than the call ending on a typo."""


def read_input(answer: Any, questions: list[Question]) -> InputAnswer:
    """A resume value or an approver's return for an `InputRequest`: `{"type": "respond", "responses":
    {...}}` (LangChain's `{"decisions": [...]}` wrapper and its bare `{"responses": {...}}` too), or a
    reject. Anything else (an approval's `True`, answers that do not fit) answers nothing: an approval
    is not an answer, so the call is not continued."""
    if isinstance(answer, Mapping) and "decisions" in answer:
        decisions = answer.get("decisions")
        answer = decisions[0] if isinstance(decisions, list) and len(decisions) == 1 else None
    if not isinstance(answer, Mapping):
        return InputAnswer(None, "no answers were given to the tool's questions")
    if answer.get("type") == "reject":
        message = answer.get("message")
        return InputAnswer(None, message if isinstance(message, str) else "the person declined to answer")
    if answer.get("type", "respond") != "respond":
        return InputAnswer(None, f"a {str(answer.get('type'))[:40]!r} decision does not answer the tool's questions")
    try:
        return InputAnswer(read_answers(questions, answer.get("responses")))
    except AskingError as exc:
        return InputAnswer(None, f"the answers could not be read: {exc}", unusable=True)


# ------------------------------------------------------------------ trace context

def call_meta(call_id: str, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`meta` with the W3C `traceparent` of call `call_id` in this run (`traces.context`) added, unless the
    caller's meta has one: the server's spans join the run's trace, under the call's span."""
    meta = dict(meta or {})
    if "traceparent" not in meta:
        meta["traceparent"] = traceparent(run_id(), f"call:{call_id}")
    return meta


def traced(backend: Any, call_id: str) -> Any:
    """A toolbox, or an MCP tool's scope, as a view whose calls carry call `call_id`'s `traceparent` (the
    view's own meta wins, a traceparent of its own included); a backend of your own as it is."""
    if not hasattr(backend, "scoped"):
        return backend
    return backend.scoped(call_meta(call_id, getattr(backend, "meta", None)))


def run_id() -> str:
    """The id of the run this code runs in: a recorded run's trace id (`RUN_ID` in the config's metadata),
    else the thread's id; a run with neither has no id to join on, and each call gets a trace of its own."""
    try:
        from langgraph.config import get_config

        config = get_config()
    except RuntimeError:  # outside a graph run
        config = {}
    found = (config.get("metadata") or {}).get(RUN_ID) or (config.get("configurable") or {}).get("thread_id")
    return str(found) if found else uuid.uuid4().hex


# ------------------------------------------------------------------ replies

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
