"""What a person is asked about a call, and how their answer is read.

Approvals use LangChain's human-in-the-loop shapes, so LangGraph Studio and Agent Inbox-style UIs
render them: the request is a `ToolApprovalRequest` (`type: "tool_approval"`, the call, a description
with the rehearsed outcome) and the answer a decision (`{"type": "approve"}`, `{"type": "reject",
"message": ...}`, `{"type": "edit", "edited_action": {"name": ..., "args": ...}}`); `True` / `"yes"`
still mean approve. A tool whose server asks for input mid-call is asked about in the same shape
(`InputRequest`, `type: "tool_input"`) and answered with `{"type": "respond", "responses": {key: answer}}`.
Everything shown is escaped (`visible`): calls, reasons and predictions come from models and servers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from typing_extensions import NotRequired, TypedDict

from envace_mcp._text import key_text, visible
from envace_mcp.graph.proposal import Proposal
from envace_mcp.policy.types import Prediction, ToolCall
from envace_mcp.toolbox.asking import Answer, AskingError, Question, read_answers


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
    call_number: NotRequired[int]
    """Which of the calls proposed together this is (1-based), where they are asked about one by one in
    their order; absent for a call asked about alone."""
    calls_in_turn: NotRequired[int]


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


def approval_request(p: Proposal, sent: Any = None) -> ApprovalRequest:
    """The request for `p`; `sent`: the arguments the server will receive when they differ from the call's
    (a scope's bound arguments, `arguments_sent`): those are what is shown and approved."""
    reason = p.decision.reason if p.decision else None
    rehearsal = p.prediction.model_dump(mode="json") if p.prediction else None
    args = p.call.arguments if sent is None else sent
    request: ApprovalRequest = {"type": "tool_approval", "tool_call_id": p.call.id, "name": p.call.name, "args": args,
                                "description": describe(p, args), "rehearsal": rehearsal, "reason": reason}
    if p.position is not None:
        request["call_number"], request["calls_in_turn"] = p.position[0] + 1, p.position[1]
    return request


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
    if p.position is not None:
        lines.insert(0, f"Call {p.position[0] + 1} of {p.position[1]} proposed together (asked in their order):")
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

