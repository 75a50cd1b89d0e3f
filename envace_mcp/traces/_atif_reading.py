"""An ATIF trajectory's parts as trace steps (`envace_mcp.traces.atif.from_atif` reads with these): every
value of an untrusted document type-checked and bounded before it reaches a trace."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any, get_args

from envace_mcp.toolbox.catalog import MAX_NAME_CHARS, ToolSpec, bound_tool
from envace_mcp.toolbox.result import ErrorKind, ToolResult
from envace_mcp.traces.schema import RESULT_CHARS, STOPPED, Comparison

MAX_ID_CHARS = 256
"""The longest session or tool-call id read: an id names a run or call, it holds no data."""
PREDICTION = ("status", "result", "code", "message", "p_error", "confidence")
"""The fields of a rehearsal (`Prediction`) a trajectory carries in a tool call's `extra`."""


class Reading:
    """A trajectory's steps as trace steps, in order."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.task: str | None = None
        self.final: str | None = None
        self.now = datetime.now(timezone.utc).timestamp()
        self.ids: set[str] = set()

    def add(self, **fields: Any) -> None:
        self.steps.append({"index": len(self.steps), **fields})

    def turn(self, step: Any, when: float | None) -> None:
        when = when if when is not None else (self.steps[-1]["time"] if self.steps else self.now)
        message = text_of(step.message)
        calls = [(self._unique(c.tool_call_id), c, _name(c.function_name), _arguments(c)) for c in step.tool_calls or []]
        results: dict[str, list[Any]] = {}
        for result in step.observation.results if step.observation else []:
            results.setdefault(result.source_call_id or "", []).append(result)
        metrics = step.metrics
        tokens = {key: _bounded_list(getattr(metrics, name, None), name) for key, name in (
            ("prompt_ids", "prompt_token_ids"), ("completion_ids", "completion_token_ids"), ("logprobs", "logprobs"))}
        self.add(role="act", node="agent", time=when, text=message, **tokens, parsed={
            "tool_calls": [{"id": i, "name": name, "arguments": arguments} for i, _, name, arguments in calls],
            "content": message, "thinking": _cut(step.reasoning_content)})
        self.final = message if not calls else None
        for call_id, call, name, arguments in calls:
            answer = results.get(call.tool_call_id, [])
            self._call(call_id, name, arguments, call.extra or {}, answer.pop(0) if answer else None, when)

    def _call(self, call_id: str, name: str, arguments: Any, extra: dict[str, Any], result: Any, when: float) -> None:
        given = extra.get("decision")[:64] if isinstance(extra.get("decision"), str) else None
        simulated = extra.get("simulated") is True or given == "simulate"
        ran = extra.get("ran") is not False and not simulated and given not in STOPPED
        # marked not run, without a decision that stops a call: it never reached a server all the same
        decision = given if ran or simulated or given in STOPPED else "reject"
        reason = _cut(extra.get("reason") if isinstance(extra.get("reason"), str) else None, 2_000)
        prediction = _prediction(name, arguments, extra.get("rehearsal"))
        if prediction is not None:
            self.add(role="rehearse", node="rehearse", call_id=call_id, time=when, parsed=prediction)
        if given is not None:
            self.add(role="gate", node="gate", call_id=call_id, time=when, tool=name, arguments=arguments,
                     decision=given, reason=reason, confidence=_number(extra.get("gate_confidence")))
        if result is None:
            return
        outcome = result.extra or {}
        self.add(role="tool", node="act", call_id=call_id, time=when, tool=name, arguments=arguments,
                 result=_reply(name, arguments, result.content, outcome, ran), simulated=simulated, decision=decision,
                 reason=reason, comparison=_comparison(outcome.get("comparison")),
                 approved=extra.get("approved") if isinstance(extra.get("approved"), bool) else None,
                 edited=extra.get("edited") if isinstance(extra.get("edited"), dict) else None,
                 asked=extra.get("asked") if isinstance(extra.get("asked"), list) else None)

    def _unique(self, call_id: str) -> str:
        """The call's id, made unique in the run (some agents number calls afresh each turn)."""
        call_id = bounded_id(call_id, "tool_call_id")
        unique, n = call_id, 1
        while unique in self.ids:
            n += 1
            unique = f"{call_id}#{n}"
        self.ids.add(unique)
        return unique


def _reply(tool: str, arguments: Any, content: Any, outcome: dict[str, Any], ran: bool) -> dict[str, Any]:
    """An observation's content as `ToolResult` JSON: text blocks, media parts as links to their files. An
    error of a call that ran is the tool's unless it says otherwise; one that did not is nobody's."""
    if isinstance(content, str) or content is None:
        blocks = [{"type": "text", "text": content or ""}]
    else:
        blocks = [{"type": "text", "text": part.text} if part.type == "text" else
                  {"type": "resource_link", "uri": part.source.path, "name": part.source.path,
                   "mimeType": part.source.media_type} for part in content]
    failed = outcome.get("is_error") is True
    kind = outcome.get("error_kind") if outcome.get("error_kind") in get_args(ErrorKind) else None
    latency = _number(outcome.get("latency_s"))
    return ToolResult(tool=tool, arguments=arguments, content=blocks, structured_content=outcome.get("structured_content"),
                      is_error=failed, error_kind=kind or ("tool_error" if failed and ran else None),
                      latency_s=latency if latency is not None and latency >= 0 else 0.0).model_dump(mode="json")


def _prediction(tool: str, arguments: Any, rehearsal: Any) -> dict[str, Any] | None:
    """A rehearsal recorded in a tool call's extra, when it reads as one."""
    if not isinstance(rehearsal, dict):
        return None
    from envace_mcp.policy.types import Prediction

    try:
        return Prediction.model_validate({k: rehearsal[k] for k in PREDICTION if k in rehearsal} | {
            "tool": tool, "arguments": arguments}).model_dump(mode="json")
    except ValueError:
        return None


def _comparison(value: Any) -> dict[str, Any] | None:
    try:
        return Comparison.model_validate(value).model_dump() if isinstance(value, dict) else None
    except ValueError:
        return None


def catalog(agent: Any, ours: bool) -> tuple[list[dict[str, Any]] | None, int]:
    """The tool definitions as catalog entries (`ToolSpec.to_dict`) within a live listing's bounds, and how
    many were left out. OpenAI's `{"type": "function", "function": {...}}`, its inner object, and MCP's
    `{"name", "inputSchema"}` are read."""
    if agent.tool_definitions is None:
        return None, 0
    more = (agent.extra or {}).get("tools") if ours else None
    more = more if isinstance(more, dict) else {}
    specs: dict[str, dict[str, Any]] = {}
    left_out = 0
    for entry in agent.tool_definitions:
        function = entry.get("function") if isinstance(entry.get("function"), dict) else entry
        name = function.get("name")
        schema = function.get("parameters", function.get("input_schema", function.get("inputSchema")))
        known = more.get(name) if isinstance(name, str) and isinstance(more.get(name), dict) else {}
        try:
            spec, _ = bound_tool(ToolSpec.from_dict({**function, "input_schema": schema, **known}))
        except Exception:  # noqa: BLE001 - an untrusted definition is left out and counted, never a crash
            spec = None
        if spec is None:
            left_out += 1
            continue
        specs.setdefault(spec.name, spec.to_dict())
    return list(specs.values()), left_out


# ---------------------------------------------------------------------------- values

def time_of(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def text_of(message: Any) -> str:
    """A message's text (a multimodal message's text parts), cut to `RESULT_CHARS`."""
    text = message if isinstance(message, str) else "\n".join(p.text for p in message if p.type == "text")
    return _cut(text) or ""


def _cut(text: str | None, limit: int = RESULT_CHARS) -> str | None:
    return text if text is None or len(text) <= limit else text[: limit - 1] + "…"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def bounded_id(value: str, what: str) -> str:
    if not value or len(value) > MAX_ID_CHARS:
        raise ValueError(f"a {what} of {len(value):,} characters (1 to {MAX_ID_CHARS} read)")
    return value


def _name(name: str) -> str:
    if not name or len(name) > MAX_NAME_CHARS:
        raise ValueError(f"a tool name of {len(name):,} characters (1 to {MAX_NAME_CHARS}, as MCP allows)")
    return name


def _arguments(call: Any) -> Any:
    raw = (call.extra or {}).get("arguments")  # a call whose arguments were not an object, as `to_atif` keeps it
    arguments = raw if not call.arguments and raw is not None else call.arguments
    size = len(json.dumps(arguments, ensure_ascii=False, default=str))
    if size > RESULT_CHARS:
        raise ValueError(f"tool call {call.tool_call_id[:40]!r}: its arguments are {size:,} characters of JSON, "
                         f"over {RESULT_CHARS:,}")
    return arguments


def _bounded_list(values: list[Any] | None, what: str) -> list[Any] | None:
    if values is not None and len(values) > RESULT_CHARS:
        raise ValueError(f"{len(values):,} {what}, over {RESULT_CHARS:,}")
    return values
