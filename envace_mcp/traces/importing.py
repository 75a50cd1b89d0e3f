"""Tool-call logs of your own agents as traces: every real call is a world-model example, the server's
reply its label (`envace traces import`, docs/traces.md#import-your-tool-call-logs).

The log is JSONL, one episode a line:

    {"id": "ep-1", "task": "Delete my to-do about taxes", "calls": [
        {"tool": "list_todos", "arguments": {}, "result": {"todos": [{"id": "t1", "title": "File my taxes"}]}},
        {"tool": "delete_todo", "arguments": {"id": "t9"}, "error": "no to-do with id 't9'"}]}

`id` is optional (default `<file stem>:<line>`), `task` too (`user` is read as its alias). A call has a
`tool`, its `arguments` (an object, or a JSON string of one as OpenAI tool calls carry them; absent: `{}`)
and exactly one of `result` — an MCP `CallToolResult` as the server sent it (`content`, then
`structuredContent` / `isError` or their snake_case names, and nothing else), else any JSON value as its
structured content (a string as its text) — or `error`, the server's error message. A line that breaks
this is skipped whole and reported by number; a call to a tool the catalog lacks is skipped and counted.

`--mutate` adds the failures the agent happened not to make, replayed on sandbox servers: see
`envace_mcp.traces.mutating`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace_mcp.errors import UserError
from envace_mcp.toolbox.catalog import ToolCatalog, ToolSpec
from envace_mcp.toolbox.result import ToolResult
from envace_mcp.traces._jsonl import read_runs
from envace_mcp.traces.schema import Step, Trace

SHOWN = 5
"""Skipped lines a summary names (the rest are counted): enough to find the pattern, short on a terminal."""
MAX_DEPTH = 128
"""How deep arrays and objects may nest in one line. A trace's JSON is written by pydantic, which goes no
deeper than 255 levels (the trace's own around the call's), and read back by Python's json, which stops at
the recursion limit: a line nested deeper is skipped, not turned into a trace no store can write."""
_RESULT_KEYS = frozenset({"content", "structuredContent", "structured_content", "isError", "is_error", "_meta", "meta"})


class _Skipped(ValueError):
    """Why a log line gives no episode: malformed, or no call to a known tool (one line of text)."""


@dataclass
class ImportSummary:
    """What `read_log` made of a log: counts, and everything skipped with why."""

    log: str
    episodes: int = 0
    calls: int = 0
    errors: int = 0
    """Imported calls whose result is an error."""
    invalid_arguments: int = 0
    """Imported calls whose arguments break their tool's input schema (kept: the server answered them)."""
    skipped: list[tuple[int, str]] = field(default_factory=list)
    """Lines not imported, `(line number, why)`."""
    unknown_tools: Counter[str] = field(default_factory=Counter)
    """Calls skipped because the catalog has no such tool, per tool name."""

    def report(self) -> list[str]:
        """The summary as lines of text; they quote the log, so a terminal shows them through `safe`."""
        lines = [f"imported {self.episodes} episode(s) with {self.calls} call(s), {self.errors} of them errors, "
                 f"from {self.log}"]
        if self.invalid_arguments:
            lines.append(f"{self.invalid_arguments} call(s) kept whose arguments break their tool's input schema "
                         "(they ran: the server's reply is still the truth)")
        if self.skipped:
            lines.append(skipped_lines(self.skipped))
        if self.unknown_tools:
            lines.append(f"skipped {sum(self.unknown_tools.values())} call(s) to tools the catalog lacks: "
                         f"{counted_names(self.unknown_tools)}")
        return lines


def counted_names(counts: Counter[str]) -> str:
    """`name (count)` for the most frequent few; a name from a log is cut, not trusted to be short."""
    shown = [f"{name if len(name) <= 60 else name[:59] + '…'} ({count})" for name, count in counts.most_common(SHOWN * 2)]
    more = f" and {len(counts) - len(shown)} more" if len(counts) > len(shown) else ""
    return ", ".join(shown) + more


# ---------------------------------------------------------------------------- reading


def load_catalog(path: str | Path) -> list[ToolSpec]:
    """A saved catalog: a JSON list of tools as `envace servers ls --json` prints them or as `tools/list`
    returns them (the list, or the result object holding it as `tools`)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"catalog {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UserError(f"catalog {str(path)!r} is not JSON: {exc}") from None
    tools = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(tools, list):
        raise UserError(f"catalog {str(path)!r} must be a JSON list of tools (or an object with a 'tools' list)")
    specs: dict[str, ToolSpec] = {}
    for number, entry in enumerate(tools, 1):
        try:
            spec = ToolSpec.from_dict(entry)
        except ValueError as exc:
            raise UserError(f"catalog {str(path)!r}, tool {number}: {exc}") from None
        if spec.name in specs:
            raise UserError(f"catalog {str(path)!r} lists tool {spec.name!r} twice")
        specs[spec.name] = spec
    if not specs:
        raise UserError(f"catalog {str(path)!r} lists no tools")
    return list(specs.values())


def read_log(path: str | Path, catalog: ToolCatalog | Iterable[ToolSpec]) -> tuple[list[Trace], ImportSummary]:
    """Each episode of a tool-call log as a finished real-mode `Trace` of `tool` steps, with the catalog
    attached (`Trace.tools`). Malformed lines and calls to unknown tools are skipped and reported in the
    summary; a log that yields no episode at all is a `UserError` saying why."""
    path = Path(path)
    catalog = catalog if isinstance(catalog, ToolCatalog) else ToolCatalog(catalog)
    summary = ImportSummary(log=str(path))
    tools = catalog.to_dicts()

    def parse(raw: bytes, number: int) -> Trace:
        trace = _trace(_episode(raw, f"{path.stem}:{number}"), catalog, tools, summary)
        trace.metadata["source"] = f"{path.name}:{number}"
        return trace

    traces, summary.skipped = read_runs(path, parse, what="log")
    if not traces:
        raise UserError(_why_nothing(path, len(summary.skipped), summary))
    return traces, summary


def _why_nothing(path: Path, lines: int, summary: ImportSummary) -> str:
    if not lines:
        return f"log {str(path)!r} is empty: one episode per line expected ({{\"task\": ..., \"calls\": [...]}})"
    number, why = summary.skipped[0]
    unknown = f"; calls to tools the catalog lacks: {counted_names(summary.unknown_tools)}" if summary.unknown_tools else ""
    return f"log {str(path)!r}: no episode imported from its {lines} line(s) (line {number}: {why}{unknown})"


@dataclass(frozen=True)
class _Episode:
    id: str
    task: str | None
    calls: list[tuple[str, Any, dict[str, Any]]]
    """`(tool, arguments, the call as logged)` in order."""


def json_value(raw: bytes) -> Any:
    """UTF-8 JSON text as its value; a `ValueError` saying in a few words why it is not one."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    except ValueError as exc:
        raise ValueError(f"not JSON ({str(exc)[:80]})") from None


def json_object(raw: bytes, what: str) -> dict[str, Any]:
    """One line of a JSONL file as a JSON object (`what` it should be, for the message); a `ValueError`
    saying in a few words why it is not one. Shared by the files runs are imported from."""
    data = json_value(raw)
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {_kind(data)}, not {what}")
    if deeper_than(data, MAX_DEPTH):
        raise ValueError(TOO_DEEP)
    return data


TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"


def deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects in `value` nest more than `limit` levels (walked with a list, not recursion:
    the value may be too deep for that)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def skipped_lines(skipped: list[tuple[int, str]], unit: str = "line") -> str:
    """`skipped N line(s): line 2: why; ...` for a summary, the first `SHOWN` named (`unit`: what the
    numbers count, lines of a file or the entries of a list)."""
    shown = "; ".join(f"{unit} {number}: {why}" for number, why in skipped[:SHOWN])
    more = f"; and {len(skipped) - SHOWN} more" if len(skipped) > SHOWN else ""
    return f"skipped {len(skipped)} {unit}(s): {shown}{more}"


def _episode(raw: bytes, default_id: str) -> _Episode:
    try:
        data = json_object(raw, "an episode object")
    except ValueError as exc:
        raise _Skipped(str(exc)) from None
    episode_id = data.get("id", default_id)
    if isinstance(episode_id, int) and not isinstance(episode_id, bool):
        episode_id = str(episode_id)
    if not isinstance(episode_id, str) or not episode_id:
        raise _Skipped("'id' must be a non-empty string")
    task = data.get("task", data.get("user"))
    if task is not None and not isinstance(task, str):
        raise _Skipped(f"'task' must be a string, not a JSON {_kind(task)}")
    calls = data.get("calls")
    if not isinstance(calls, list):
        raise _Skipped("no 'calls' list" if calls is None else f"'calls' must be a list, not a JSON {_kind(calls)}")
    if not calls:
        raise _Skipped("its 'calls' list is empty")
    return _Episode(episode_id, task, [_call(call, number) for number, call in enumerate(calls, 1)])


def _call(call: Any, number: int) -> tuple[str, Any, dict[str, Any]]:
    where = f"call {number}"
    if not isinstance(call, dict):
        raise _Skipped(f"{where} is a JSON {_kind(call)}, not an object")
    tool = call.get("tool")
    if not isinstance(tool, str) or not tool:
        raise _Skipped(f"{where} has no 'tool' name")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI tool calls carry their arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except RecursionError:
            raise _Skipped(f"{where}: 'arguments' {TOO_DEEP}") from None
        except ValueError:
            raise _Skipped(f"{where}: 'arguments' is a string that is not JSON") from None
        if deeper_than(arguments, MAX_DEPTH):
            raise _Skipped(f"{where}: 'arguments' {TOO_DEEP}")
    if not isinstance(arguments, dict):
        raise _Skipped(f"{where}: 'arguments' must be an object, not a JSON {_kind(arguments)}")
    has = ("result" in call, "error" in call)
    if all(has) or not any(has):
        raise _Skipped(f"{where} has {'both' if all(has) else 'neither'} 'result' {'and' if all(has) else 'nor'} "
                         "'error' (exactly one: what the server answered)")
    if "error" in call and not isinstance(call["error"], str):
        raise _Skipped(f"{where}: 'error' must be the server's message, a string")
    _check_result(call.get("result"), where)
    return tool, arguments, call


def _is_call_result(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("content"), list) and set(value) <= _RESULT_KEYS


def _check_result(value: Any, where: str) -> None:
    if not _is_call_result(value):
        return
    if not all(isinstance(block, dict) and isinstance(block.get("type"), str) for block in value["content"]):
        raise _Skipped(f"{where}: 'result.content' must hold content blocks (objects with a 'type')")
    flag = value.get("isError", value.get("is_error", False))
    if not isinstance(flag, bool):
        raise _Skipped(f"{where}: 'result.isError' must be true or false")


def _text(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


def logged_result(tool: str, server: str | None, arguments: Any, call: dict[str, Any]) -> ToolResult:
    """A logged call's answer (`result` or `error`, as the module docstring says) as a `ToolResult`."""
    if "error" in call:
        return ToolResult(tool=tool, server=server, arguments=arguments, content=_text(call["error"]), is_error=True,
                          error_kind="tool_error")
    value = call["result"]
    if _is_call_result(value):
        content = list(value["content"])
        structured = value.get("structuredContent", value.get("structured_content"))
        if structured is not None and not isinstance(structured, dict):
            # a ToolResult holds object structured content only: any other value is kept as the reply's text
            content = content or _text(json.dumps(structured, indent=2, ensure_ascii=False))
            structured = None
        failed = value.get("isError", value.get("is_error", False))
        return ToolResult(tool=tool, server=server, arguments=arguments, content=content, structured_content=structured,
                          is_error=failed, error_kind="tool_error" if failed else None)
    if isinstance(value, str):
        return ToolResult(tool=tool, server=server, arguments=arguments, content=_text(value))
    # the text as MCP servers write structured output: the JSON, indented
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return ToolResult(tool=tool, server=server, arguments=arguments, content=_text(text),
                      structured_content=value if isinstance(value, dict) else None)


def _find_tool(catalog: ToolCatalog, name: str) -> ToolSpec | None:
    """The catalog entry a logged call names: by catalog name, else by the server's own name when only one
    server offers it (the catalog prefixes names two servers share)."""
    spec = catalog.get(name)
    if spec is not None:
        return spec
    owners = [s for s in catalog if s.remote_name == name]
    return owners[0] if len(owners) == 1 else None


def _trace(episode: _Episode, catalog: ToolCatalog, tools: list[dict[str, Any]], summary: ImportSummary) -> Trace:
    now = time.time()
    steps: list[Step] = []
    unknown: Counter[str] = Counter()
    invalid = 0
    for position, (name, arguments, call) in enumerate(episode.calls):
        spec = _find_tool(catalog, name)
        if spec is None:
            unknown[name] += 1
            continue
        invalid += bool(spec.validator.errors(arguments))
        result = logged_result(spec.name, spec.server, arguments, call)
        steps.append(Step(index=len(steps), role="tool", call_id=f"call_{position}", time=now, tool=spec.name,
                          arguments=arguments, result=result.model_dump(mode="json")))
    summary.unknown_tools.update(unknown)
    if not steps:
        raise _Skipped(f"no call to a tool the catalog has (only {counted_names(unknown)})")
    summary.episodes += 1
    summary.calls += len(steps)
    summary.errors += sum(bool(s.result and s.result["is_error"]) for s in steps)
    summary.invalid_arguments += invalid
    return Trace(run_id=uuid.uuid4().hex, task_id=episode.id, mode="real", task=episode.task, tools=tools,
                 started_at=now, ended_at=now, status="finished", steps=steps)


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
