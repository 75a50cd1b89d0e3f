"""The act phase, once: approval → execute / simulate / refuse → record, for one gated call.

The graph's `act` node, `RehearsingToolNode` and `RehearsalMiddleware` (sync and async) all run
`act_steps`, so a call is approved, edited, re-gated, refused and recorded the same way whichever
form a user picked. It is written without I/O: it yields what it needs (an approval, a real call)
and the caller's driver (`act_async`, `act_sync`) answers with its own approver and its own way of
running a tool (the toolbox, or LangChain's tool handler), then receives the reply and the record.

A tool whose server asks for input while it runs (`ToolResult.input_required`) is asked about with an
`InputRequest` (`Ask` again) and continued with the answers (`Respond`), round after round. Approval
comes first: a destructive call reaches its server only approved, so its questions come from a call a
person already let run, and no answer can approve a call (an approval answers no question, and a
rejected call never asks).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.messages import ToolMessage

from envace_mcp._sync import run_sync
from envace_mcp.graph import calls
from envace_mcp.graph.calls import ApprovalRequest, InputRequest, Proposal, RehearsalRecord
from envace_mcp.graph.gate import Decision
from envace_mcp.policy.types import ToolCall
from envace_mcp.toolbox import ToolResult, ToolSpec


@dataclass(frozen=True)
class Ask:
    """The call needs a person's (or a rule's) answer to `request`: an approval, or a running call's
    questions (`InputRequest`)."""

    request: ApprovalRequest | InputRequest


@dataclass(frozen=True)
class Run:
    """Run `call` on the real tool `spec` (the proposed call, or the edit a reviewer approved); the
    driver answers with a `ToolResult`, a `ToolMessage`, or whatever the tool handler returned."""

    call: ToolCall
    spec: ToolSpec | None


@dataclass(frozen=True)
class Respond:
    """Continue the call whose server asked (`waiting`, a `ToolResult` with `input_required`) with
    `answers`; the driver answers with the next `ToolResult` (finished, or asking again)."""

    call: ToolCall
    spec: ToolSpec | None
    waiting: ToolResult
    answers: dict[str, Any]


@dataclass(frozen=True)
class Acted:
    """What became of the call: the reply for the agent and the call's record."""

    reply: Any
    """A `ToolMessage` (or a foreign tool's `Command`), answering the proposed call's id."""
    record: RehearsalRecord
    ran: bool
    """Whether a real tool ran."""


ANSWER_TRIES = 3
"""Times one round of a tool's questions is put to the person when the answers do not fit (a wrong key,
a value the form refuses) before the call ends unanswered."""

Regate = Callable[[ToolCall], Proposal]
"""Validates and gates an edited call as a proposal of its own, with the gate the run uses."""


def act_steps(p: Proposal, regate: Regate, sent: Callable[[ToolCall], Any] | None = None,
              ) -> Generator[Ask | Run | Respond, Any, Acted]:
    """The act phase of one gated proposal (its `decision` set by `calls.gate`). `sent`: the arguments the
    server will receive for a call (`calls.arguments_sent`), which the approval request shows."""
    record = p.record()
    if p.tool_changed:  # the server restarted with another listing between the gate and now
        decision = Decision("reject", f"tool '{p.call.name}' changed since the gate judged it (its server now lists "
                                      "another tool under that name); not run")
        record["decision"], record["reason"] = decision.action, decision.reason
        return Acted(calls.refusal(replace(p, decision=decision)), record, False)
    if p.decision is None:  # nothing ungated runs
        p = replace(p, decision=Decision("reject", "the gate has not judged this call; not run"))
        record["decision"], record["reason"] = p.decision.action, p.decision.reason  # type: ignore[union-attr]
    action = p.decision.action  # type: ignore[union-attr]
    target = p
    if action == "ask":
        request = calls.approval_request(p, sent(p.call) if sent is not None else None)
        approval = calls.read_approval((yield Ask(request)), p.call)
        record["approved"] = approval.approved
        if not approval.approved:
            record["decision"] = "rejected_by_human"
            return Acted(calls.rejected(p.call, approval), record, False)
        if approval.edited is not None:
            record["edited"] = {"name": approval.edited.name, "args": approval.edited.arguments}
            target = regate(approval.edited)
            assert target.decision is not None
            if target.decision.action not in ("execute", "ask"):  # the reviewer approved this edit: no second ask
                record["decision"], record["reason"] = target.decision.action, f"the edited call: {target.decision.reason}"
                refused = Decision(target.decision.action, record["reason"])
                return Acted(calls.refusal(replace(p, prediction=None, decision=refused)), record, False)
        action = "execute"
    if action == "execute":
        outcome = yield Run(target.call, target.spec)
        if isinstance(outcome, ToolResult) and outcome.asked:  # a 2025 server asked mid-call, answered in-process
            record.setdefault("asked", []).extend(outcome.asked)
        while (waiting := _waiting(outcome)) is not None:  # the server asks before it can finish
            questions, round = waiting.input_required["questions"], waiting.input_required["round"]  # type: ignore[index]
            shown = sent(target.call) if sent is not None else None
            answer = yield from answers_to(target, questions, round, shown)
            record.setdefault("asked", []).append({"round": round, "questions": questions, "answers": answer.responses,
                                                   **({"why": answer.why} if answer.why else {})})
            if answer.responses is None:
                record["decision"], record["reason"] = "rejected_by_human", f"the tool's questions: {answer.why}"
                record["real"] = waiting.model_dump(mode="json")
                return Acted(calls.unanswered(p.call, answer.why or "none given"), record, True)
            outcome = yield Respond(target.call, target.spec, waiting, answer.responses)
        reply, result = _reply(p.call, outcome)
        if result is not None:  # an edit's result is not scored against the rehearsal of another call
            record.update(calls.observed(p if target is p else Proposal(p.call, p.spec), result))  # type: ignore[typeddict-item]
        return Acted(reply, record, True)
    if action == "simulate":
        return Acted(calls.simulated_reply(p.call, p.prediction), record, False)
    return Acted(calls.refusal(p), record, False)


def answers_to(p: Proposal, questions: list[Any], round: int, shown: Any = None,
               ) -> Generator[Ask, Any, calls.InputAnswer]:
    """Put a round of a tool's questions to the person (`Ask`), again while the answers do not fit (a wrong
    key, a value the form refuses: told why, `ANSWER_TRIES` times in all), and return their answer."""
    answer = calls.read_input((yield Ask(calls.input_request(p, questions, round, shown))), questions)
    for _ in range(ANSWER_TRIES - 1):
        if not answer.unusable:
            break
        answer = calls.read_input((yield Ask(calls.input_request(p, questions, round, shown, problem=answer.why))),
                                  questions)
    return answer


async def ask_answers(ask: Callable[[Any], Any], p: Proposal, questions: list[Any], round: int = 1,
                      shown: Any = None) -> calls.InputAnswer:
    """`answers_to` driven by an approver of its own (sync or async), outside the act phase: a 2025
    server's mid-call question, `envace call`."""
    steps = answers_to(p, questions, round, shown)
    step: Any = _next(steps, None)
    while isinstance(step, Ask):
        reply = ask(step.request)
        step = _next(steps, await reply if inspect.isawaitable(reply) else reply)
    return step


async def send_answers(backend: Any, step: Respond, max_rounds: int) -> Any:
    """Continue a call whose server asked, through `backend` (a toolbox, or an MCP tool's scope: the
    server the call went to), with the call's `traceparent`; a backend that cannot take answers ends it."""
    backend = calls.traced(backend, step.call.id)
    if not hasattr(backend, "respond"):
        return _cannot_answer(step)
    return await backend.respond(step.waiting, step.answers, expect=step.spec, max_rounds=max_rounds)


def _cannot_answer(step: Respond) -> ToolResult | None:
    return calls.result_of(step.call, calls.unanswered(step.call, "this tool cannot be sent answers"))


def _waiting(outcome: Any) -> ToolResult | None:
    """The result of a call whose server asked for input, from a toolbox's `ToolResult` or a tool handler's
    reply carrying one (our MCP tools put it in the artifact)."""
    result = outcome.artifact if isinstance(outcome, ToolMessage) else outcome
    return result if isinstance(result, ToolResult) and result.input_required is not None else None


def _reply(call: ToolCall, outcome: Any) -> tuple[Any, ToolResult | None]:
    """The agent's reply and the real result, from a toolbox's `ToolResult` or a tool handler's reply."""
    if isinstance(outcome, ToolResult):
        return calls.reply(call, outcome.text, "error" if outcome.is_error else "success", outcome), outcome
    return outcome, calls.result_of(call, outcome) if isinstance(outcome, ToolMessage) else None


def _next(steps: Generator[Any, Any, Any], answer: Any) -> Any:
    """The generator's next step after `answer`, or the value it returned."""
    try:
        return steps.send(answer)
    except StopIteration as done:
        return done.value


Respondent = Callable[[Respond], Any]
"""Continues a call whose server asked, with the answers (a driver's own way to reach that server)."""


def _answer(step: Ask | Run | Respond, ask: Callable[[Any], Any], run: Callable[[ToolCall, ToolSpec | None], Any],
            respond: Respondent | None) -> Any:
    if isinstance(step, Ask):
        return ask(step.request)
    if isinstance(step, Run):
        return run(step.call, step.spec)
    if respond is None:  # a tool that cannot be continued: its questions end it
        return _cannot_answer(step)
    return respond(step)


async def act_async(p: Proposal, *, ask: Callable[[Any], Any],
                    run: Callable[[ToolCall, ToolSpec | None], Any], regate: Regate,
                    sent: Callable[[ToolCall], Any] | None = None, respond: Respondent | None = None) -> Acted:
    """`act_steps` driven from async code; `ask`, `run` and `respond` may be sync or async."""
    steps = act_steps(p, regate, sent)
    step = _next(steps, None)
    while not isinstance(step, Acted):
        answer = _answer(step, ask, run, respond)
        step = _next(steps, await answer if inspect.isawaitable(answer) else answer)
    return step


def act_sync(p: Proposal, *, ask: Callable[[Any], Any],
             run: Callable[[ToolCall, ToolSpec | None], Any], regate: Regate,
             sent: Callable[[ToolCall], Any] | None = None, respond: Respondent | None = None) -> Acted:
    """`act_steps` driven from sync code, in the caller's thread (a sync tool runs where it expects to);
    an async approver (or respondent) is run to completion."""
    steps = act_steps(p, regate, sent)
    step = _next(steps, None)
    while not isinstance(step, Acted):
        answer = _answer(step, ask, run, respond)
        step = _next(steps, run_sync(answer) if inspect.isawaitable(answer) else answer)
    return step
