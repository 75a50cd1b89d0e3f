"""Parsing model output for each role. Never raises: every failure is a typed issue or error.

Act output uses the Hermes / Qwen tool-call format the prompts teach:
    <tool_call>
    {"name": "get_balance", "arguments": {"account_id": "CHK-1"}}
    </tool_call>
Several calls, trailing text, thinking blocks, code fences and minor JSON damage (trailing commas,
Python literals, single quotes, missing closing braces, junk after the object) are handled; what
was repaired is reported, what cannot be repaired becomes an `invalid_tool_call` issue.

Rehearse output is EnvACE's `<execution_result>JSON</execution_result>` (the simulator format), or the
tool's reply itself as a tool message would hold it (the inline format, `parse_tool_turn`).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from envace_mcp.policy.types import ActOutput, Critique, ParseIssue, Prediction, ToolCall
from envace_mcp.toolbox import ToolSpec

_THINK = re.compile(r"<think>(.*?)</think>", re.S)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.S)
_FENCE = re.compile(r"```(?:json|tool_call)?\s*\n?(.*?)```", re.S)
_RESULT_OPEN, _RESULT_CLOSE = "<execution_result>", "</execution_result>"
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_PY_LITERALS = re.compile(r"(?<![\"\w])(True|False|None)(?![\"\w])")

KNOWN_TOOL_ERROR_CODES = {"INVALID_TOOL_CALL_FORMAT", "TOOL_NOT_AVAILABLE", "INVALID_PARAMETERS", "EXECUTION_ERROR"}


def _snippet(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _balanced(text: str) -> str | None:
    """The first JSON object/array in `text`, cut at its matching close, or closed if truncated."""
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    stack: list[str] = []
    in_string = escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack or stack[-1] != ch:
                return text[start:i]  # a stray closer: cut before it and close what is open
            stack.pop()
            if not stack:
                return text[start : i + 1]
    tail = text[start:].rstrip().rstrip(",")
    return tail + ('"' if in_string else "") + "".join(reversed(stack))


def loads_lenient(text: str) -> tuple[Any, bool]:
    """Parse JSON, repairing minor damage. Returns (value, repaired); raises ValueError if hopeless."""
    stripped = text.strip()
    try:
        return json.loads(stripped), False
    except (ValueError, RecursionError):
        pass
    candidate = _balanced(stripped)
    if candidate is None:
        raise ValueError("no JSON object or array found")
    attempts = [candidate]
    fixed = _TRAILING_COMMA.sub(r"\1", candidate)
    attempts.append(fixed)
    fixed = _PY_LITERALS.sub(lambda m: {"True": "true", "False": "false", "None": "null"}[m.group(1)], fixed)
    attempts.append(fixed)
    if '"' not in fixed and "'" in fixed:
        attempts.append(fixed.replace("'", '"'))
    for attempt in attempts:
        try:
            return json.loads(attempt), True
        except (ValueError, RecursionError):
            continue
    raise ValueError("JSON could not be repaired")


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:12]}"


def _split_thinking(text: str) -> tuple[str | None, str, list[ParseIssue]]:
    issues: list[ParseIssue] = []
    thoughts = [m.strip() for m in _THINK.findall(text)]
    body = _THINK.sub("", text)
    if "<think>" in body:  # unterminated: everything after it is thinking
        head, _, rest = body.partition("<think>")
        thoughts.append(rest.strip())
        body = head
        issues.append(ParseIssue(code="unterminated_thinking", message="<think> was never closed"))
    elif "</think>" in body:  # the template opened <think> in the prompt
        before, _, body = body.partition("</think>")
        thoughts.insert(0, before.strip())
    thinking = "\n".join(t for t in thoughts if t) or None
    return thinking, body, issues


def _calls_from_value(value: Any, source: str, issues: list[ParseIssue]) -> list[ToolCall]:
    items = value if isinstance(value, list) else [value]
    calls: list[ToolCall] = []
    for item in items:
        if not isinstance(item, dict):
            issues.append(ParseIssue(code="invalid_tool_call", message="a tool call must be a JSON object",
                                     snippet=_snippet(source)))
            continue
        if "function" in item and isinstance(item["function"], dict):  # OpenAI-shaped
            item = item["function"]
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            issues.append(ParseIssue(code="invalid_tool_call", message="a tool call needs a non-empty 'name'",
                                     snippet=_snippet(source)))
            continue
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments, repaired = loads_lenient(arguments) if arguments.strip() else ({}, False)
                if repaired:
                    issues.append(ParseIssue(code="repaired_json", message="arguments string repaired",
                                             snippet=_snippet(source)))
            except ValueError:
                issues.append(ParseIssue(code="invalid_arguments_json",
                                         message="arguments is a string that is not JSON", snippet=_snippet(source)))
        if arguments is None:
            arguments = {}
        calls.append(ToolCall(id=_new_id(), name=name.strip(), arguments=arguments))
    return calls


def parse_act(text: str) -> ActOutput:
    """Tool calls and/or a final answer from an act-role completion."""
    thinking, body, issues = _split_thinking(text or "")
    calls: list[ToolCall] = []
    blocks = list(_TOOL_CALL.finditer(body))
    for match in blocks:
        source = match.group(1)
        if not match.group(2):
            issues.append(ParseIssue(code="unterminated_tool_call", message="<tool_call> was never closed",
                                     snippet=_snippet(source)))
        try:
            value, repaired = loads_lenient(source)
        except ValueError as exc:
            issues.append(ParseIssue(code="invalid_tool_call", message=f"tool call is not JSON: {exc}",
                                     snippet=_snippet(source)))
            continue
        if repaired:
            issues.append(ParseIssue(code="repaired_json", message="tool call JSON repaired", snippet=_snippet(source)))
        calls.extend(_calls_from_value(value, source, issues))
    content = _TOOL_CALL.sub("", body).strip()
    if not blocks:
        calls, content = _untagged_calls(body, issues)
    if not calls and not content and not issues:
        issues.append(ParseIssue(code="empty_output", message="the model produced no text"))
    return ActOutput(tool_calls=calls, content=content, thinking=thinking, issues=issues)


def _untagged_calls(body: str, issues: list[ParseIssue]) -> tuple[list[ToolCall], str]:
    """Calls written without <tool_call> tags: in a code fence, or as the whole message."""
    stripped = body.strip()
    candidates = [(m.group(1), m.group(0)) for m in _FENCE.finditer(stripped)]
    if stripped.startswith(("{", "[")):
        candidates.append((stripped, stripped))
    for source, whole in candidates:
        try:
            value, _ = loads_lenient(source)
        except ValueError:
            continue
        items = value if isinstance(value, list) else [value]
        if items and all(isinstance(i, dict) and "name" in i and ("arguments" in i or "parameters" in i) for i in items):
            calls = _calls_from_value(value, source, issues)
            if calls:
                issues.append(ParseIssue(code="untagged_tool_call", message="tool call without <tool_call> tags",
                                         snippet=_snippet(source)))
                return calls, stripped.replace(whole, "").strip()
    return [], stripped


def _invalid(call: ToolCall, code: str, message: str, result: Any = None, repaired: bool = False) -> Prediction:
    return Prediction(tool=call.name, arguments=call.arguments, status="invalid", code=code, message=message,
                      result=result, repaired=repaired)


def parse_prediction(text: str, call: ToolCall, tool: ToolSpec | None) -> Prediction:
    """A rehearse-role completion as a typed prediction (EnvACE's `<execution_result>` format)."""
    _, body, _ = _split_thinking(text or "")
    if not body.strip():
        return _invalid(call, "EMPTY_OUTPUT", "the rehearsal produced no text")
    start = body.find(_RESULT_OPEN)
    if start < 0:
        return _invalid(call, "MISSING_TAG", f"no {_RESULT_OPEN} tag in the rehearsal")
    inner = body[start + len(_RESULT_OPEN):]
    end = inner.find(_RESULT_CLOSE)
    if end < 0:
        return _invalid(call, "MALFORMED_TAG", f"{_RESULT_OPEN} was never closed")
    payload = inner[:end].strip()
    if not payload:
        return _invalid(call, "EMPTY_OUTPUT", "the execution result is empty")
    try:
        value, repaired = loads_lenient(payload)
    except ValueError as exc:
        return _invalid(call, "INVALID_JSON", f"the execution result is not JSON: {exc}")
    return _predicted(value, repaired, call, tool)


def _predicted(value: Any, repaired: bool, call: ToolCall, tool: ToolSpec | None) -> Prediction:
    """A parsed rehearsal value as a prediction: a predicted `error_tool_call`, or a result checked
    against the tool's output schema (both rehearse formats)."""
    # An output schema describing an object (as every 2025 one does) wants a non-empty object; since
    # 2026-07-28 one may describe any JSON value, which the schema check below judges. A tool without
    # one may answer anything (τ²'s `calculate` returns a number, a search an empty list).
    structured = tool is not None and _wants_object(tool.output_schema)
    if value is None or (structured and (not isinstance(value, dict) or not value)):
        return _invalid(call, "WRONG_TYPE", "the execution result must be a non-empty JSON object"
                        if structured else "the execution result must not be null", result=value, repaired=repaired)
    if isinstance(value, dict) and "error_tool_call" in value:
        error = value["error_tool_call"]
        error = error if isinstance(error, dict) else {"message": str(error)}
        code = str(error.get("code") or "EXECUTION_ERROR").upper()
        return Prediction(tool=call.name, arguments=call.arguments, status="tool_error",
                          code=code if code in KNOWN_TOOL_ERROR_CODES else code, message=str(error.get("message", "")),
                          details=error.get("details"), result=value, repaired=repaired)
    validator = tool.output_validator if tool is not None else None
    if validator is not None:
        problems = validator.errors(value)
        if problems:
            first = problems[0]
            return _invalid(call, "OUTPUT_SCHEMA_MISMATCH",
                            f"field '{first['field']}': {first['message']}" if first["field"] else first["message"],
                            result=value, repaired=repaired)
    return Prediction(tool=call.name, arguments=call.arguments, status="result", result=value, repaired=repaired)


def _wants_object(schema: Any) -> bool:
    """Whether an output schema describes objects only (`type: object`, or properties without a type)."""
    if not isinstance(schema, dict) or not schema:
        return False
    kind = schema.get("type")
    return kind == "object" or (kind is None and "properties" in schema)


def parse_tool_turn(text: str, call: ToolCall, tool: ToolSpec | None, close: str = "", *, cut: bool = False) -> Prediction:
    """An inline rehearsal as a typed prediction (`read_tool_turn`), its text kept whatever it is (an
    unreadable one's too, for the approver and the report). `cut`: the rehearsal ran out of tokens, so an
    unreadable one is `UNKNOWN`, no prediction of anything."""
    prediction = read_tool_turn(text, call, tool, close)
    if prediction.status == "invalid" and cut:
        prediction = prediction.model_copy(update={
            "code": "UNKNOWN", "message": f"no readable reply within the rehearsal's token budget ({prediction.message})"})
    if prediction.text is None:
        _, body, _ = _split_thinking(text or "")
        prediction = prediction.model_copy(update={"text": body.strip() or None})
    return prediction


def read_tool_turn(text: str, call: ToolCall, tool: ToolSpec | None, close: str = "") -> Prediction:
    """An inline rehearsal (the tool's reply, as the model continued the act context) as a typed
    prediction. The reply is what a server's tool message holds: JSON for structured results, and for
    failures the server's error text (`Error executing tool …`) — there is no status bit in the text a
    model sees, so prose from a tool that returns structured results, or prose starting with "Error",
    is a predicted tool error; markup (a `<tool_call>`, a template tag) is no reply at all. `close` is the
    template's end of the tool turn (cut off when present)."""
    _, body, _ = _split_thinking(text or "")
    marker = close.strip()
    if marker and marker in body:
        body = body[: body.index(marker)]
    body = body.strip()
    if not body:
        return _invalid(call, "EMPTY_OUTPUT", "the rehearsal produced no text")
    if body.startswith("<tool_call>") or (body[0] == "<" and tool is not None and tool.output_schema):
        # the model took the next act turn (or wrote template markup) where the tool's reply goes: no
        # prediction at all, not a predicted failure that would block a destructive call
        return _invalid(call, "NOT_A_TOOL_REPLY", f"the rehearsal wrote markup, not the tool's reply: {body[:60]!r}")
    if body[0] in "{[":
        try:
            value, repaired = loads_lenient(body)
        except ValueError as exc:
            return _invalid(call, "INVALID_JSON", f"the tool reply is not JSON: {exc}")
        prediction = _predicted(value, repaired, call, tool)  # the same checks as the simulator format
    elif body.lower().startswith(("error", "invalid arguments")) or (tool is not None and tool.output_schema):
        message = body.split(":", 1)[1].strip() if body.lower().startswith("error executing tool") and ":" in body else body
        prediction = Prediction(tool=call.name, arguments=call.arguments, status="tool_error", code="EXECUTION_ERROR",
                                message=message, result={"error_tool_call": {"code": "EXECUTION_ERROR", "message": message}})
    else:  # a tool without an output schema may answer in prose (τ²'s `transfer_to_human_agents`)
        prediction = Prediction(tool=call.name, arguments=call.arguments, status="result", result=body)
    return prediction.model_copy(update={"text": body})


_VERDICT = re.compile(r"verdict\s*[:=]\s*\**\s*(success|succeeded|pass(?:ed)?|failure|failed|fail)", re.I)
_SECTION = re.compile(r"^\s*(pitfalls|advice)\s*[:=]\s*", re.I | re.M)


def parse_critique(text: str) -> Critique:
    """VERDICT / PITFALLS / ADVICE sections of a critique; missing sections stay empty."""
    _, body, _ = _split_thinking(text or "")
    verdict = _VERDICT.search(body)
    success = None if verdict is None else verdict.group(1).lower().startswith(("succ", "pass"))
    sections: dict[str, str] = {}
    marks = list(_SECTION.finditer(body))
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(body)
        sections[mark.group(1).lower()] = body[mark.end():end].strip()
    return Critique(success=success, pitfalls=sections.get("pitfalls", ""), advice=sections.get("advice", ""),
                    text=body.strip())
