"""ATIF, the Agent Trajectory Interchange Format (v1.8, models in the `atif` extra): recorded runs out as
trajectories other tools read, and other agents' trajectories in as traces `envace world-model fit` learns
from.

Out (`to_atif`, `write_atif`), one trajectory per run: `session_id` is the run id; `agent` names
envace-mcp, the model, the run's tool catalog as OpenAI function definitions, and in its `extra` the run's
settings and what a function definition lacks of each tool (server, annotations, output schema). The task
is the first (user) step; each act turn an agent step with its `tool_calls` and an `observation` holding
one result per answered call, its `content` the reply as the agent saw it; the final answer an agent
message. What EnvACE adds to a call rides in `extra`: on the tool call whether it `ran` (a call the gate
stopped or simulated never reached a server), the gate's `decision` and `reason`, any approval, and the
`rehearsal` (its predicted status, result, `p_error`); on the result `is_error`, `error_kind`, structured
content the text does not already say, and how the rehearsal compared. Rewards, status and the run's ids
are the trajectory's `extra`; token counts are step metrics (`tokens=True` adds the ids and logprobs).

In (`from_atif`, `read_atif`): each agent step becomes an `act` step and, per answered call, a `tool` step
whose result is `ToolResult` JSON, so `observed_calls` reads it; a call marked `"ran": false` stays
unrun. `agent.tool_definitions` become the trace's catalog. A document is untrusted: it is validated with
the ATIF models, nested no deeper than `MAX_DEPTH`, its replies cut to `RESULT_CHARS` as a trace stores
them, its names, ids and arguments bounded; a document that breaks a bound is skipped whole, said why.
System steps, later user messages and embedded subagent trajectories are not imported.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, get_args

from envace_mcp._version import __version__
from envace_mcp.errors import UserError
from envace_mcp.toolbox.result import ToolResult
from envace_mcp.traces._atif_reading import PREDICTION, Reading, bounded_id, catalog, text_of, time_of
from envace_mcp.traces._jsonl import read_runs, why_invalid, write_runs
from envace_mcp.traces.importing import (MAX_DEPTH, SHOWN, TOO_DEEP, counted_names, deeper_than, json_object,
                                         json_value, skipped_lines)
from envace_mcp.traces.schema import RESULT_CHARS, Step, Trace

VERSION = "ATIF-v1.8"
AGENT = "envace-mcp"
"""`agent.name` of the trajectories written here: only their `extra` is read back as a run's fields."""
MAX_DOCUMENT_BYTES = 64 * RESULT_CHARS
"""The longest trajectory line read: 64 replies kept whole. A longer one is passed over unread."""
MAX_FILE_BYTES = 4 * MAX_DOCUMENT_BYTES
"""A `.json` file is read whole: past this, write it as JSONL (one trajectory a line)."""
_EXTRA = "pip install 'envace-mcp[atif]'"
_SETTINGS = ("model_revision", "adapter", "sampling", "gate", "limits", "rehearsal", "rehearse_format")
_RUN = ("task_id", "suite", "group_id", "mode", "status", "error", "rewards", "metadata")
_CATALOG = ("remote_name", "server", "output_schema", "annotations")


def _models() -> Any:
    try:
        import atif
    except ImportError:
        raise UserError(f"ATIF trajectories need the atif package: {_EXTRA}") from None
    return atif


# ---------------------------------------------------------------------------- runs out


def to_atif(trace: Trace, *, tokens: bool = False) -> dict[str, Any]:
    """One run as an ATIF trajectory (JSON), validated by the ATIF models; a `ValueError` when it cannot be
    one. `tokens=True` keeps the act turns' token ids and logprobs in their metrics."""
    atif = _models()
    calls: dict[str, dict[str, Step]] = {}
    for step in trace.steps:
        if step.call_id and step.role in ("rehearse", "gate", "tool"):
            calls.setdefault(step.call_id, {})[step.role] = step
    proposed = {c.get("id") for s in trace.steps_of("act") for c in _proposed(s)}
    steps: list[dict[str, Any]] = []
    if trace.task is not None:
        steps.append({"source": "user", "message": trace.task, "timestamp": _iso(trace.started_at)})
    for step in trace.steps:
        if step.role == "act":
            steps.append(_turn(step, calls, tokens))
        elif step.role == "tool" and step.call_id not in proposed:  # no recorded turn proposed it (an imported log)
            call = {"id": step.call_id or f"call_{step.index}", "name": step.tool, "arguments": step.arguments}
            steps.append({"source": "agent", "message": "", "timestamp": _iso(step.time),
                          **_calls([call], {call["id"]: {**calls.get(step.call_id or "", {}), "tool": step}})})
    last = steps[-1] if steps else {}
    if trace.final_answer is not None and (last.get("source") != "agent" or last.get("tool_calls")
                                           or last.get("message") != trace.final_answer):
        steps.append({"source": "agent", "message": trace.final_answer, "timestamp": _iso(trace.ended_at)})
    for number, step in enumerate(steps, 1):
        step["step_id"] = number
    settings = trace.model_dump(mode="json", include=set(_SETTINGS))
    more = {t.get("name"): _kept({k: t.get(k) for k in _CATALOG}) for t in trace.tools or []}
    agent = {"name": AGENT, "version": __version__, "model_name": trace.model,
             "tool_definitions": [_definition(t) for t in trace.tools] if trace.tools is not None else None,
             "extra": _kept({**settings, "tools": more}) or None}
    run = trace.model_dump(mode="json", include=set(_RUN))
    critiques = [_kept({"text": s.text, "timestamp": _iso(s.time)}) for s in trace.steps_of("critique")]
    extra = _kept({**run, "started_at": _iso(trace.started_at), "ended_at": _iso(trace.ended_at), "critiques": critiques})
    metrics = [s["metrics"] for s in steps if s.get("metrics")]
    totals = {"total_prompt_tokens": sum(m.get("prompt_tokens", 0) for m in metrics),
              "total_completion_tokens": sum(m.get("completion_tokens", 0) for m in metrics),
              "total_steps": len(steps)} if metrics else None
    document = {"schema_version": VERSION, "session_id": trace.run_id, "agent": _kept(agent), "steps": steps,
                "final_metrics": totals, "extra": extra or None}
    return atif.Trajectory.model_validate(_kept(document)).to_json_dict()


def write_atif(traces: Iterable[Trace], path: str | Path, *, tokens: bool = False,
               skipped: list[str] | None = None) -> int:
    """Write runs as ATIF trajectories, one a line (`to_atif`); returns how many. The file appears whole or
    not at all; a run that cannot be written is left out, and why is appended to `skipped`."""
    _models()
    return write_runs(traces, path, lambda trace: to_atif(trace, tokens=tokens), skipped=skipped)


def _proposed(step: Step) -> list[dict[str, Any]]:
    parsed = step.parsed if isinstance(step.parsed, dict) else {}
    return [c for c in parsed.get("tool_calls") or [] if isinstance(c, dict)]


def _turn(step: Step, calls: dict[str, dict[str, Step]], tokens: bool) -> dict[str, Any]:
    parsed = step.parsed if isinstance(step.parsed, dict) else {}
    content, thinking = parsed.get("content"), parsed.get("thinking")
    proposed = [{**c, "id": c.get("id") or f"call_{step.index}_{n}"} for n, c in enumerate(_proposed(step))]
    metrics = None
    if step.prompt_ids is not None or step.completion_ids is not None:
        metrics = {"prompt_tokens": len(step.prompt_ids or []), "completion_tokens": len(step.completion_ids or [])}
        if tokens:
            metrics.update(prompt_token_ids=step.prompt_ids, completion_token_ids=step.completion_ids,
                           logprobs=step.logprobs)
    return {"source": "agent", "message": content if isinstance(content, str) else step.text or "",
            "timestamp": _iso(step.time), "reasoning_content": thinking if isinstance(thinking, str) else None,
            "metrics": metrics, "extra": {"finish_reason": step.finish_reason} if step.finish_reason else None,
            **_calls(proposed, calls)}


def _calls(proposed: list[dict[str, Any]], calls: dict[str, dict[str, Step]]) -> dict[str, Any]:
    """An agent step's `tool_calls` and `observation` for its proposed calls."""
    if not proposed:
        return {}
    tool_calls, results = [], []
    for call in proposed:
        known = calls.get(call["id"], {})
        tool, gate, rehearse = known.get("tool"), known.get("gate"), known.get("rehearse")
        decided = gate or tool
        arguments = call.get("arguments")
        prediction = rehearse.parsed if rehearse is not None and isinstance(rehearse.parsed, dict) else None
        extra = {"ran": tool is not None and tool.ran, "simulated": tool is not None and tool.simulated or None,
                 "decision": decided and decided.decision, "reason": decided and decided.reason,
                 "gate_confidence": gate and gate.confidence, "approved": tool and tool.approved,
                 "edited": tool and tool.edited, "asked": tool and tool.asked,
                 "rehearsal": _kept({k: prediction.get(k) for k in PREDICTION}) if prediction else None,
                 "arguments": None if isinstance(arguments, dict) else arguments}
        tool_calls.append({"tool_call_id": call["id"], "function_name": str(call.get("name") or (tool and tool.tool)),
                           "arguments": arguments if isinstance(arguments, dict) else {}, "extra": _kept(extra)})
        if tool is not None and tool.result is not None:
            results.append({"source_call_id": call["id"], "content": _seen(tool.result), "extra": _outcome(tool)})
    return {"tool_calls": tool_calls, "observation": {"results": results} if results else None}


def _seen(result: dict[str, Any]) -> str | list[dict[str, Any]]:
    """The reply as the agent saw it: its text; content parts when it holds media an ATIF file can point at."""
    blocks = result.get("content")
    if not isinstance(blocks, list):
        return json.dumps(result, ensure_ascii=False, default=str)
    if not any(_media(block) for block in blocks):
        return ToolResult.text_of(result)
    return [{"type": _media(block), "source": {"media_type": block["mimeType"], "path": block["uri"]}} if _media(block)
            else {"type": "text", "text": ToolResult.text_of({"content": [block]})} for block in blocks]


def _media(block: Any) -> str | None:
    """"image" / "audio" for a link to media of a type ATIF takes (`read_atif` stores its parts so)."""
    if not isinstance(block, dict) or block.get("type") != "resource_link" or not isinstance(block.get("uri"), str):
        return None
    atif = _models()
    return next((kind for kind, types in (("image", atif.ImageMediaType), ("audio", atif.AudioMediaType))
                 if block.get("mimeType") in get_args(types)), None)


def _outcome(tool: Step) -> dict[str, Any] | None:
    result = tool.result or {}
    structured = result.get("structured_content")
    if structured is not None and _json(ToolResult.text_of(result)) == structured:
        structured = None  # the text says it already (MCP servers write structured output as its JSON)
    return _kept({"is_error": bool(result.get("is_error")), "error_kind": result.get("error_kind"),
                  "structured_content": structured, "latency_s": result.get("latency_s") or None,
                  "comparison": tool.comparison.model_dump(mode="json") if tool.comparison else None})


def _definition(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": _kept({"name": tool.get("name"), "description": tool.get("description"),
                                                   "parameters": tool.get("input_schema")})}


# ---------------------------------------------------------------------------- trajectories in


@dataclass
class AtifSummary:
    """What `read_atif` made of a file: trajectories and calls read, and what was skipped with why."""

    path: str
    unit: str = "line"
    """What `skipped` numbers count: lines of a JSONL file, or the trajectories of a `.json` one."""
    runs: int = 0
    calls: int = 0
    not_run: int = 0
    """Imported calls the trajectory marks as never reaching a server (stopped, simulated)."""
    unanswered: int = 0
    """Calls with no observation result: kept in their turn, no reply to learn from."""
    definitions_left_out: int = 0
    undefined: Counter[str] = field(default_factory=Counter)
    """Calls to tools their trajectory's `tool_definitions` lack, per name (world-model fit skips them)."""
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def report(self) -> list[str]:
        """The summary as lines of text; they quote the file, so a terminal shows them through `safe`."""
        lines = [f"imported {self.runs} trajectory(ies) with {self.calls} answered call(s), {self.not_run} of "
                 f"them not run, from {self.path}"]
        if self.unanswered:
            lines.append(f"{self.unanswered} call(s) without an observation: kept in their turn, no reply to learn from")
        if self.definitions_left_out:
            lines.append(f"{self.definitions_left_out} tool definition(s) left out: no name, a schema that is not "
                         "an object, or past the catalog's bounds")
        if self.undefined:
            lines.append(f"{sum(self.undefined.values())} call(s) to tools their trajectory does not define "
                         f"(world-model fit skips them): {counted_names(self.undefined)}")
        if self.skipped:
            lines.append(skipped_lines(self.skipped, self.unit))
        return lines


def read_atif(path: str | Path) -> tuple[list[Trace], AtifSummary]:
    """The trajectories of an ATIF file as traces: a `.json` file holding one trajectory or a list of them,
    any other a JSONL file with one a line. A malformed trajectory is skipped and reported with its number;
    a file with none to import is a `UserError`."""
    _models()
    path = Path(path)
    whole = path.suffix.lower() == ".json"
    summary = AtifSummary(str(path), unit="trajectory" if whole else "line")

    def parse(raw: Any, number: int) -> Trace:
        data = json_object(raw, "a trajectory object") if isinstance(raw, bytes) else raw
        trace, left_out = _from_atif(data if isinstance(data, dict) else _not_an_object(data))
        trace.metadata.setdefault("source", f"{path.name}:{number}")
        _count(summary, trace, left_out)
        return trace

    if whole:
        traces = _read_whole(path, parse, summary)
    else:
        traces, summary.skipped = read_runs(path, parse, what="ATIF file", limit=MAX_DOCUMENT_BYTES)
    seen: Counter[str] = Counter()
    for trace in traces:  # a session id continued over several files or segments names each run once
        seen[trace.run_id] += 1
        if seen[trace.run_id] > 1:
            trace.run_id = f"{trace.run_id}#{seen[trace.run_id]}"
    summary.runs = len(traces)
    if not traces:
        why = "; ".join(f"{summary.unit} {n}: {w}" for n, w in summary.skipped[:SHOWN]) or "it holds no trajectory"
        raise UserError(f"no trajectory to import from {str(path)!r}: {why}")
    return traces, summary


def _read_whole(path: Path, parse: Callable[[Any, int], Trace], summary: AtifSummary) -> list[Trace]:
    try:
        raw = path.read_bytes() if path.stat().st_size <= MAX_FILE_BYTES else None
    except OSError as exc:
        raise UserError(f"ATIF file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if raw is None:
        raise UserError(f"ATIF file {str(path)!r} is over {MAX_FILE_BYTES:,} bytes: write it as JSONL, one "
                        "trajectory a line")
    try:
        data = json_value(raw)
    except ValueError as exc:
        raise UserError(f"ATIF file {str(path)!r}: {exc}") from None
    traces = []
    for number, entry in enumerate(data if isinstance(data, list) else [data], 1):
        try:
            if deeper_than(entry, MAX_DEPTH):
                raise ValueError(TOO_DEEP)
            traces.append(parse(entry, number))
        except ValueError as exc:
            summary.skipped.append((number, str(exc)[:200]))
    return traces


def _not_an_object(data: Any) -> dict[str, Any]:
    raise ValueError(f"a JSON {type(data).__name__}, not a trajectory object")


def _count(summary: AtifSummary, trace: Trace, left_out: int) -> None:
    defined = {t.get("name") for t in trace.tools or []}
    answered = trace.steps_of("tool")
    summary.calls += len(answered)
    summary.not_run += sum(not s.ran for s in answered)
    summary.unanswered += sum(len(_proposed(s)) for s in trace.steps_of("act")) - len(answered)
    summary.definitions_left_out += left_out
    summary.undefined.update(s.tool for s in answered if s.tool not in defined and s.tool)


def from_atif(data: dict[str, Any]) -> Trace:
    """Another agent's ATIF trajectory (JSON) as a finished trace; a `ValueError` saying why it is not one."""
    return _from_atif(data)[0]


def _from_atif(data: dict[str, Any]) -> tuple[Trace, int]:
    """The trace, and how many tool definitions were left out."""
    atif = _models()
    if deeper_than(data, MAX_DEPTH):
        raise ValueError(TOO_DEEP)
    try:
        document = atif.Trajectory.model_validate(data)
    except Exception as exc:  # noqa: BLE001 - any shape of bad document is a reported line, never a crash
        raise ValueError(f"not an ATIF trajectory: {why_invalid(exc)}") from None
    if not document.schema_version.startswith("ATIF-v1."):
        raise ValueError(f"schema_version {document.schema_version[:40]!r} is not ATIF v1")
    ours = document.agent.name == AGENT
    tools, left_out = catalog(document.agent, ours)
    reading = Reading()
    stamps: list[float] = []
    for step in document.steps:
        if step.is_copied_context:  # context copied from a prior trajectory: its calls are that one's
            continue
        when = time_of(step.timestamp)
        stamps += [when] if when is not None else []
        if step.source == "user" and reading.task is None:
            reading.task = text_of(step.message)
        elif step.source == "agent":
            reading.turn(step, when)
    run_id = document.session_id or document.trajectory_id or uuid.uuid4().hex
    fields: dict[str, Any] = {
        "run_id": bounded_id(run_id, "session_id"), "model": document.agent.model_name, "task": reading.task,
        "tools": tools, "started_at": min(stamps, default=reading.now), "ended_at": max(stamps, default=reading.now),
        "final_answer": reading.final, "steps": reading.steps,
        "metadata": {} if ours else {"agent": {"name": document.agent.name[:200], "version": document.agent.version[:200]}}}
    if ours:  # our own trajectory: the run's fields come back from its extras
        extra, settings = document.extra or {}, document.agent.extra or {}
        fields.update({k: extra[k] for k in _RUN if k in extra}, **{k: settings[k] for k in _SETTINGS if k in settings})
        for key in ("started_at", "ended_at"):
            fields[key] = time_of(extra.get(key)) or fields[key]
    try:
        return Trace.model_validate(fields), left_out
    except Exception as exc:  # noqa: BLE001 - as above
        raise ValueError(f"not a trace: {why_invalid(exc)}") from None


# ---------------------------------------------------------------------------- values


def _kept(values: dict[str, Any]) -> dict[str, Any]:
    """`values` without the empty ones (None, {}, [])."""
    return {k: v for k, v in values.items() if v is not None and v != {} and v != []}


def _iso(seconds: float | None) -> str | None:
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
