"""Tools that ask: a call whose server needs a person's input before it can finish.

A 2026-07-28 server answers such a `tools/call` with an `InputRequiredResult` (questions and an opaque
`request_state`) and expects the same request again with the answers. The toolbox does not answer for
anyone: the call comes back as a `ToolResult` with `error_kind="input_required"` and its
`input_required` (`InputRequired`: the questions, the state, the round), and `Toolbox.respond` sends
the answers. The graph asks a person in between, in the approval shape (`graph.calls.input_request`).

Only elicitation is answered. Sampling and roots requests end the call with an error that says so
(this client lends a server neither its model nor its files), and so does a round that asks nothing.
What a server asks is untrusted: a question with a message past `MAX_MESSAGE`, a schema that is not a
flat form of primitive fields, more than `MAX_QUESTIONS` at once, or a server still asking after
`max_input_rounds` rounds ends the call with an error instead of reaching a person.

A handshake-era (2025) server asks with an `elicitation/create` request in the middle of a call. That
request names no call on the wire (stdio), so it cannot be told apart from another call's on a shared
session, and the run cannot pause there: it is answered by the call's own asker when one was given and
no other call is in flight, and otherwise refused with a message that says why (`LegacyQuestions`);
the call's result says what the server asked either way (`ToolResult.asked`, or a note in its text).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from typing_extensions import NotRequired, TypedDict

from envace_mcp.toolbox.result import ToolResult
from envace_mcp.toolbox.validation import SchemaValidator

MAX_INPUT_ROUNDS = 4
"""Rounds of questions one call may ask before the toolbox gives up: a confirmation and a follow-up or
two; a server that keeps asking is looping, and a person would be asked forever."""
MAX_QUESTIONS = 8
"""Questions in one round: a form a person can answer, not a survey."""
MAX_MESSAGE = 4000
"""Characters of one question a person is asked to read; a longer one is refused, not cut (the part
cut off could be the part that matters, as with a call's arguments)."""
MAX_SCHEMA = 8000
"""Characters of one question's schema as JSON."""
MAX_REQUEST_STATE = 64 * 1024
"""Characters of a server's opaque state kept on a waiting call (and so in its graph state, checkpoint
and trace) to be sent back: continuation state, not a payload."""
ACTIONS = ("accept", "decline", "cancel")
_FIELD_TYPES = frozenset({"string", "number", "integer", "boolean", "array"})


class Question(TypedDict):
    """One question of a server, as a person (or `EnvaceContext.approve`) is shown it."""

    key: str
    """The server's name for the question: its answer goes back under the same key."""
    message: str
    mode: Literal["form", "url"]
    requested_schema: NotRequired[dict[str, Any]]
    """`form`: the flat object schema the answer's `content` must satisfy."""
    url: NotRequired[str]
    """`url`: the address the person is asked to visit (nothing comes back but the action)."""


class InputRequired(TypedDict):
    """A call waiting for answers (`ToolResult.input_required`)."""

    questions: list[Question]
    request_state: str | None
    """The server's opaque state, sent back as it came."""
    round: int
    """How many times this call has asked (1: the first)."""


class Answer(TypedDict):
    """One answer: `{"action": "accept", "content": {...}}` (a form's fields; none for a url),
    `{"action": "decline"}` (no answer, the call goes on) or `{"action": "cancel"}` (abandon it)."""

    action: Literal["accept", "decline", "cancel"]
    content: NotRequired[dict[str, Any] | None]


class AskingError(ValueError):
    """What a server asked cannot be put to a person, or answers do not fit the questions."""


def read_questions(requests: Mapping[str, Any]) -> list[Question]:
    """The questions of an `InputRequiredResult`'s `input_requests` (SDK request objects), checked.
    Raises `AskingError` for anything but bounded elicitation."""
    if not requests:
        raise AskingError("the server returned a round with no question (a continuation); only questions are answered")
    if len(requests) > MAX_QUESTIONS:
        raise AskingError(f"the server asked {len(requests)} questions at once, more than {MAX_QUESTIONS}")
    return [_question(str(key), request) for key, request in requests.items()]


def _question(key: str, request: Any) -> Question:
    method = getattr(request, "method", None)
    if method != "elicitation/create":
        what = {"sampling/createMessage": "sampling (a completion from this client's model)",
                "roots/list": "roots (this client's files)"}.get(str(method), repr(method))
        raise AskingError(f"question {key!r} asks for {what}, which this client does not answer: only elicitation")
    if len(key) > 200:
        raise AskingError(f"a question key is {len(key)} characters long")
    params = request.params
    message = str(params.message)
    if len(message) > MAX_MESSAGE:
        raise AskingError(f"question {key!r} is {len(message)} characters long, more than the {MAX_MESSAGE} a person "
                          "is asked to read")
    if getattr(params, "mode", "form") == "url":
        url = str(params.url)
        if not url.startswith(("https://", "http://")) or len(url) > 2000:
            raise AskingError(f"question {key!r} sends a person to {url[:80]!r}, not a web address")
        return {"key": key, "message": message, "mode": "url", "url": url}
    schema = params.requested_schema
    problem = _schema_problem(schema)
    if problem:
        raise AskingError(f"question {key!r} has a malformed schema: {problem}")
    return {"key": key, "message": message, "mode": "form", "requested_schema": schema}


def _schema_problem(schema: Any) -> str | None:
    """Why `schema` is not the flat form of primitive fields elicitation allows (None: it is)."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "not an object schema"
    if len(json.dumps(schema, default=str)) > MAX_SCHEMA:
        return f"longer than {MAX_SCHEMA} characters"
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return "no properties"
    for name, spec in properties.items():
        if not isinstance(spec, dict) or spec.get("type") not in _FIELD_TYPES:
            return f"field {str(name)[:80]!r} is not a string, number, integer, boolean or list of choices"
    return None


def read_answers(questions: list[Question], answers: Any) -> dict[str, Answer]:
    """`answers` (keyed by question key) checked against the questions; raises `AskingError` naming
    what is missing or malformed."""
    if not isinstance(answers, Mapping):
        raise AskingError(f"answers must be an object keyed by question, not {type(answers).__name__}")
    keys = [q["key"] for q in questions]
    missing = [k for k in keys if k not in answers]
    extra = [str(k) for k in answers if k not in keys]
    if missing or extra:
        raise AskingError("; ".join(filter(None, [missing and f"no answer for {', '.join(map(repr, missing))}",
                                                  extra and f"no question {', '.join(map(repr, extra))}"])))
    out: dict[str, Answer] = {}
    for question in questions:
        answer = answers[question["key"]]
        action = answer.get("action") if isinstance(answer, Mapping) else None
        if action not in ACTIONS:
            raise AskingError(f"the answer to {question['key']!r} must have an action of accept, decline or cancel")
        if action != "accept":
            out[question["key"]] = {"action": action}
            continue
        content = answer.get("content")
        if question["mode"] == "form" and not _flat(content):
            raise AskingError(f"the answer to {question['key']!r} accepts with no content, or content that is not an "
                              "object of strings, numbers, booleans and lists of strings")
        if question["mode"] == "form":  # what the server would refuse, and the call with it, is caught here
            problems = SchemaValidator(question.get("requested_schema") or {}).errors(content)
            if problems:
                where = f"field {problems[0]['field']!r}: " if problems[0]["field"] else ""
                raise AskingError(f"the answer to {question['key']!r} does not fit its form: {where}"
                                  f"{problems[0]['message'][:200]}")
        out[question["key"]] = {"action": "accept", "content": content if question["mode"] == "form" else None}
    return out


def _flat(content: Any) -> bool:
    def primitive(value: Any) -> bool:
        return value is None or isinstance(value, (str, int, float, bool))

    return isinstance(content, Mapping) and all(
        isinstance(k, str) and (primitive(v) or isinstance(v, list) and all(isinstance(i, str) for i in v))
        for k, v in content.items())


def asked_text(tool: str, questions: list[Question]) -> str:
    """The text of a waiting call's result, for a caller that does not answer it (a plain agent)."""
    lines = [f"Tool '{tool}' needs input before it can finish, and it was not given:"]
    lines += [f"- {q['message']}" + (f" ({q['url']})" if q["mode"] == "url" else "") for q in questions]
    return "\n".join(lines)


@dataclass(frozen=True)
class Resume:
    """What continues a waiting call: the answers, the server's state, the round they answer, and how
    many rounds the call may ask."""

    answers: dict[str, Answer]
    request_state: str | None
    round: int
    max_rounds: int = MAX_INPUT_ROUNDS


class InputAsked(Exception):
    """A server answered a request with questions (`InputRequiredResult`, kept in `result`)."""

    def __init__(self, result: Any) -> None:
        super().__init__("the server asked for input before it can answer")
        self.result = result


def stop_at_questions(client: Any) -> None:
    """Make `client` raise `InputAsked` where the SDK would answer a server's questions from the session's
    callbacks and retry on its own (`Client._drive_input_required`, the one seam of that loop): the
    toolbox hands the questions to its caller instead. Everything else `Client.call_tool` does stays:
    re-listing after a `HEADER_MISMATCH`, finishing an extension's claimed result (tasks), and seeding a
    call with `input_responses` and `request_state` (what `Toolbox.respond` sends)."""
    async def questions_to_caller(first: Any, retry: Any) -> Any:
        if asks(first):
            raise InputAsked(first)
        return first

    client._drive_input_required = questions_to_caller


def seed(resume: Resume | None) -> dict[str, Any]:
    """`Client.call_tool` keyword arguments that continue a waiting call (none for a first call)."""
    if resume is None:
        return {}
    from mcp_types import ElicitResult

    responses = {k: ElicitResult(action=a["action"], content=a.get("content")) for k, a in resume.answers.items()}
    return {"input_responses": responses, "request_state": resume.request_state}


def waiting(raw: Any, *, tool: str, server: str, arguments: Any, resume: Resume | None, latency_s: float) -> ToolResult:
    """The result of a call whose server asked (`raw`, an `InputRequiredResult`; `resume`: the answers to
    its last round, if any): waiting for answers, or an error when what it asked cannot be put to a
    person or it has asked too many times."""
    round = resume.round + 1 if resume is not None else 1
    try:
        if resume is not None and round > resume.max_rounds:
            raise AskingError(f"the server kept asking: {round} rounds of questions, more than the "
                              f"{resume.max_rounds} allowed (max_input_rounds)")
        questions = read_questions(raw.input_requests or {})
        if raw.request_state is not None and len(raw.request_state) > MAX_REQUEST_STATE:
            raise AskingError(f"its request state is {len(raw.request_state):,} characters, more than the "
                              f"{MAX_REQUEST_STATE:,} a waiting call keeps")
    except AskingError as exc:
        return ToolResult.error("tool_error", f"Tool '{tool}' asked for input that was not answered: {exc}; the call "
                                "was not continued", tool=tool, server=server, arguments=arguments, latency_s=latency_s)
    pending: InputRequired = {"questions": questions, "request_state": raw.request_state, "round": round}
    return ToolResult(tool=tool, server=server, arguments=arguments, content=[{"type": "text", "text": asked_text(
        tool, questions)}], is_error=True, error_kind="input_required", input_required=dict(pending),
        latency_s=latency_s)


def asks(raw: Any) -> bool:
    """Whether a request's reply is an `InputRequiredResult`."""
    return getattr(raw, "result_type", None) == "input_required"


Asker = Callable[[list[Question]], Awaitable[Mapping[str, Answer] | None]]
"""Answers a 2025-era server's mid-call question in the caller's own way (a person asked in-process);
None: not answered."""


@dataclass
class MidCall:
    """What a handshake-era server asked while one call was in flight (`LegacyQuestions.begin`)."""

    ask: Asker | None
    """The call's asker (None: its questions are refused)."""
    answered: list[dict[str, Any]] = field(default_factory=list)
    """Questions put to the asker, `{"round", "questions", "answers"}` (`ToolResult.asked`)."""
    refused: list[str] = field(default_factory=list)
    """Messages of questions refused while the call was in flight."""

    def note(self, server: str) -> str | None:
        """What the call's result says when the server asked during it and was refused."""
        if not self.refused:
            return None
        quoted = "; ".join(json.dumps(m, ensure_ascii=False) for m in self.refused)
        return (f"[envace-mcp: during this call server '{server}' asked for input mid-call (protocol 2025 "
                f"elicitation), which this client refuses: {quoted}]")


class LegacyQuestions:
    """A session's `elicitation_callback`: declares that this client asks people (so a 2026 server puts
    its questions in an `InputRequiredResult`), and handles a handshake-era server's mid-call
    `elicitation/create`. That request names no call, and the call waits for the answer, so a run cannot
    pause for it: it is answered only when one call is in flight on the session and its caller gave an
    `ask` (an approver that answers inside the run, `Toolbox.call(ask=...)`); otherwise refused, and
    each call in flight keeps what was asked so its result can say so."""

    KEY = "elicitation"
    """The key a mid-call question is shown under (the request has none of its own)."""

    def __init__(self) -> None:
        self._calls: dict[int, MidCall] = {}
        self._next = 0

    def begin(self, ask: Asker | None) -> tuple[int, MidCall]:
        """A call starts on the session: its token (for `end`) and its record."""
        self._next += 1
        self._calls[self._next] = MidCall(ask)
        return self._next, self._calls[self._next]

    def end(self, token: int) -> None:
        self._calls.pop(token, None)

    async def __call__(self, context: Any, params: Any) -> Any:
        from mcp_types import INVALID_REQUEST, ElicitRequest, ElicitResult, ErrorData

        in_flight = list(self._calls.values())
        if len(in_flight) == 1 and in_flight[0].ask is not None:
            call = in_flight[0]
            try:
                question = _question(self.KEY, ElicitRequest(params=params))
            except (AskingError, ValueError) as exc:
                return ErrorData(code=INVALID_REQUEST, message=f"not put to a person: {str(exc)[:300]}")
            answers = await call.ask([question])
            try:  # an asker of the caller's own is held to the same form as any answer
                answers = read_answers([question], answers) if answers is not None else None
            except AskingError:
                answers = None
            call.answered.append({"round": len(call.answered) + 1, "questions": [question], "answers": answers})
            if answers is None:
                return ElicitResult(action="cancel")
            answer = answers[self.KEY]
            return ElicitResult(action=answer["action"], content=answer.get("content"))
        message = str(getattr(params, "message", ""))[:MAX_MESSAGE]
        for call in in_flight:  # the request names no call: each one in flight says the server asked
            call.refused.append(message)
        why = ("another call is in flight on this session, and the request does not say which one asks"
               if len(in_flight) > 1 else "it cannot pause the run there to ask a person, and this call has no "
               "in-process approver")
        return ErrorData(code=INVALID_REQUEST, message=(
            f"envace-mcp does not answer this elicitation sent in the middle of a call (protocol 2025): {why}. "
            "Ask with an InputRequiredResult (protocol 2026-07-28) instead."))
