"""Recorded runs as finished OpenTelemetry spans in the GenAI semantic conventions (`to_spans`); sending
them is `traces.otel`.

Per run: an `invoke_agent` span (the root), a `chat` span per model generation (`envace.role` act,
rehearse or critique; token counts, sampling), an `execute_tool` span per tool call carrying what
EnvACE adds to a call — the rehearsal's prediction, the gate's decision, the real result and how the
two compared — as attributes and as `rehearse` / `gate` / `result` events at their recorded times. A
rehearsal's `chat` span is a child of its call's span; act generations are children of the root.

Ids come from `envace_mcp.traces.context`: a call's span id is the one its `traceparent` named when
the call went to its server, so the server's own spans join the exported call. Times are the recorded
ones: a step records when it finished, so its span starts where the step before it finished (a real
call's span reaches back at least its measured latency).

Content (prompts, completions, arguments, results, the task, the answer, the gate's reasons) is
exported only with `content=True`, as the conventions make content opt-in, and every string is cut
to `max_chars`. The OpenTelemetry SDK is the `otel` extra, imported when used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envace_mcp.errors import UserError
from envace_mcp.traces.context import span_id, trace_id
from envace_mcp.traces.schema import Step, Trace

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import Span, Tracer

MAX_CHARS = 4096
"""Longest string attribute exported: a backend keeps whole spans, and one tool reply can be megabytes."""
_GENERATIONS = ("act", "rehearse", "critique")
OTEL_EXTRA = "pip install 'envace-mcp[otel]'"


def _sdk() -> Any:
    try:
        from opentelemetry.sdk import trace as sdk_trace
    except ImportError as exc:
        raise UserError(f"exporting OpenTelemetry spans needs the OpenTelemetry SDK: {OTEL_EXTRA}") from exc
    return sdk_trace


class _Ids:
    """The SDK's id generator, told each span's id before it starts: ids derived from the run."""

    def __init__(self) -> None:
        self.trace = 1
        self.span = 1

    def generate_trace_id(self) -> int:
        return self.trace

    def generate_span_id(self) -> int:
        return self.span

    def is_trace_id_random(self) -> bool:
        return False


def to_spans(traces: Iterable[Trace], *, content: bool = False, max_chars: int = MAX_CHARS,
             service_name: str = "envace-mcp") -> list[ReadableSpan]:
    """The runs as finished SDK spans (`ReadableSpan`), ready for any `SpanExporter`."""
    sdk_trace = _sdk()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    ids, collected = _Ids(), InMemorySpanExporter()  # kept here, exported afterwards in checked batches
    provider = sdk_trace.TracerProvider(  # every recorded step, whatever sampler OTEL_TRACES_SAMPLER names for live spans
        resource=Resource.create({"service.name": service_name}), sampler=ALWAYS_ON, id_generator=ids,  # type: ignore[arg-type]
        shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(collected))
    tracer = provider.get_tracer("envace_mcp.traces.otel")
    for trace in traces:
        _Run(trace, tracer, ids, _Cut(content, max_chars)).emit()
    return list(collected.get_finished_spans())


@dataclass(frozen=True)
class _Cut:
    content: bool
    max_chars: int

    def text(self, value: object) -> str:
        text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
        return text if len(text) <= self.max_chars else text[: self.max_chars - 1] + "…"


def _ns(seconds: float) -> int:
    """Unix nanoseconds as OTLP carries them (unsigned 64 bits): a recorded time that is no time, or out of
    that range, is clamped rather than failing the whole export."""
    nanoseconds = seconds * 1_000_000_000
    if not math.isfinite(nanoseconds):
        return 0 if not nanoseconds > 0 else 2**64 - 1
    return min(max(int(nanoseconds), 0), 2**64 - 1)


class _Run:
    """One trace's spans: the root, then per call and per generation, in step order."""

    def __init__(self, trace: Trace, tracer: Tracer, ids: _Ids, cut: _Cut) -> None:
        self.trace, self.tracer, self.ids, self.cut = trace, tracer, ids, cut
        self.trace_id = int(trace_id(trace.run_id), 16)
        self.starts: dict[int, float] = {}
        previous = trace.started_at
        for step in trace.steps:  # a step records when it finished: it started where the one before it ended
            self.starts[step.index] = min(previous, step.time)
            previous = max(previous, step.time)
        self.end = max([trace.ended_at or trace.started_at, previous])

    def _start(self, name: str, part: str, parent: int | None, start: float, kind: str, attributes: dict[str, Any]) -> Span:
        from opentelemetry import trace as api

        self.ids.trace, self.ids.span = self.trace_id, int(span_id(self.trace.run_id, part), 16)
        context = None
        if parent is not None:
            parent_context = api.SpanContext(self.trace_id, parent, is_remote=False,
                                             trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED))
            context = api.set_span_in_context(api.NonRecordingSpan(parent_context))
        return self.tracer.start_span(self.cut.text(name), context=context, kind=getattr(api.SpanKind, kind),
                                      attributes={k: v for k, v in attributes.items() if v is not None},
                                      start_time=_ns(start))

    def emit(self) -> None:
        from opentelemetry.trace import Status, StatusCode

        t, cut = self.trace, self.cut
        root = self._start("invoke_agent envace", "run", None, t.started_at, "INTERNAL", {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "envace",
            "gen_ai.conversation.id": cut.text(t.run_id), "gen_ai.request.model": t.model and cut.text(t.model),
            "envace.run.id": cut.text(t.run_id), "envace.task.id": t.task_id and cut.text(t.task_id),
            "envace.suite": t.suite and cut.text(t.suite), "envace.group.id": t.group_id and cut.text(t.group_id),
            "envace.mode": t.mode, "envace.status": t.status, "envace.rehearse_format": t.rehearse_format,
            **{f"envace.reward.{cut.text(r.name)}": r.value for r in t.rewards if r.value is not None},
            **(_messages("user", t.task, "gen_ai.input.messages", cut) if cut.content and t.task else {}),
            **(_messages("assistant", t.final_answer, "gen_ai.output.messages", cut)
               if cut.content and t.final_answer else {}),
        })
        if t.status == "failed":
            kind = (t.error or "error").split(":", 1)[0]
            root.set_attribute("error.type", cut.text(kind))
            root.set_status(Status(StatusCode.ERROR, cut.text(t.error or kind) if cut.content else cut.text(kind)))
        root_id = root.get_span_context().span_id
        calls: dict[str, list[Step]] = {}
        for step in t.steps:
            if step.call_id and step.role in ("rehearse", "gate", "tool"):
                calls.setdefault(step.call_id, []).append(step)
        call_spans = {call_id: self._call(call_id, steps, root_id) for call_id, steps in calls.items()}
        for step in t.steps:
            if step.role in _GENERATIONS:
                parent = call_spans.get(step.call_id or "")
                self._generation(step, parent[0].get_span_context().span_id if parent is not None else root_id)
        for span, end in call_spans.values():
            span.end(end_time=end)  # after their rehearsals: a parent ends after its children
        root.end(end_time=_ns(self.end))

    def _generation(self, step: Step, parent: int) -> None:
        t, cut = self.trace, self.cut
        sampling = step.sampling or {}
        model = t.model or "unknown"
        span = self._start(f"chat {model}", f"generate:{step.index}", parent, self.starts[step.index], "CLIENT", {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": cut.text(model),
            "gen_ai.usage.input_tokens": len(step.prompt_ids) if step.prompt_ids is not None else None,
            "gen_ai.usage.output_tokens": len(step.completion_ids) if step.completion_ids is not None else None,
            "gen_ai.request.temperature": _number(sampling.get("temperature")),
            "gen_ai.request.top_p": _number(sampling.get("top_p")),
            "gen_ai.request.top_k": _number(sampling.get("top_k")),
            "gen_ai.request.max_tokens": _number(sampling.get("max_new_tokens")),
            "gen_ai.request.seed": _number(sampling.get("seed")),
            "gen_ai.response.finish_reasons": [cut.text(step.finish_reason)] if step.finish_reason else None,
            "envace.role": step.role, "envace.rehearse.format": step.format if step.role == "rehearse" else None,
            "gen_ai.tool.call.id": step.call_id and cut.text(step.call_id),
            **(_messages("user", step.prompt_text, "gen_ai.input.messages", cut) if cut.content and step.prompt_text else {}),
            **(_messages("assistant", step.text, "gen_ai.output.messages", cut) if cut.content and step.text else {}),
        })
        span.end(end_time=_ns(step.time))

    def _call(self, call_id: str, steps: Sequence[Step], root: int) -> tuple[Span, int]:
        """The call's span, started, and when it ends (its last step)."""
        cut = self.cut
        tool_step = next((s for s in reversed(steps) if s.role == "tool"), None)
        gate = next((s for s in reversed(steps) if s.role == "gate"), None)
        rehearsal = next((s for s in reversed(steps) if s.role == "rehearse"), None)
        prediction = rehearsal.parsed if rehearsal is not None and isinstance(rehearsal.parsed, dict) else {}
        result = tool_step.result if tool_step is not None and isinstance(tool_step.result, dict) else {}
        latency = _number(result.get("latency_s")) or 0.0
        start = min(self.starts[steps[0].index], tool_step.time - latency if tool_step is not None else steps[0].time)
        name = next((s.tool for s in steps if s.tool), None) or prediction.get("tool") or "unknown"
        decided = gate or tool_step
        comparison = tool_step.comparison if tool_step is not None else None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": cut.text(name),
            "gen_ai.tool.call.id": cut.text(call_id),
            "envace.tool.server": isinstance(result.get("server"), str) and cut.text(result["server"]) or None,
            "envace.rehearsal.status": prediction.get("status") and cut.text(prediction["status"]),
            "envace.rehearsal.code": prediction.get("code") and cut.text(prediction["code"]),
            "envace.rehearsal.confidence": _number(prediction.get("confidence")),
            "envace.gate.decision": decided.decision and cut.text(decided.decision) if decided is not None else None,
            "envace.gate.confidence": gate.confidence if gate is not None else None,
            "envace.call.simulated": tool_step.simulated if tool_step is not None else None,
            "envace.call.ran": tool_step.ran if tool_step is not None else None,
            "envace.result.is_error": bool(result.get("is_error")) if tool_step is not None else None,
            "envace.comparison.score": comparison.score if comparison is not None else None,
            "envace.comparison.status_match": comparison.status_match if comparison is not None else None,
            "envace.comparison.mismatches": len(comparison.mismatches) if comparison is not None else None,
        }
        if cut.content:
            arguments = next((s.arguments for s in reversed(steps) if s.arguments is not None), None)
            attributes.update({
                "gen_ai.tool.call.arguments": cut.text(arguments) if arguments is not None else None,
                "gen_ai.tool.call.result": cut.text(_reply(result)) if tool_step is not None else None,
                "envace.gate.reason": decided.reason and cut.text(decided.reason) if decided is not None else None,
                "envace.comparison.mismatch_list": [cut.text(m) for m in comparison.mismatches[:32]]
                if comparison is not None and comparison.mismatches else None,
            })
        span = self._start(f"execute_tool {name}", f"call:{call_id}", root, start, "INTERNAL", attributes)
        for step in steps:
            span.add_event(*self._event(step), timestamp=_ns(step.time))
        if tool_step is not None and result.get("is_error"):
            from opentelemetry.trace import Status, StatusCode

            kind = cut.text(result.get("error_kind") or "tool_error")
            span.set_attribute("error.type", kind)
            span.set_status(Status(StatusCode.ERROR, kind))
        return span, _ns(max(s.time for s in steps))

    def _event(self, step: Step) -> tuple[str, dict[str, Any]]:
        cut = self.cut
        if step.role == "rehearse":
            p = step.parsed if isinstance(step.parsed, dict) else {}
            attributes = {"envace.rehearsal.status": p.get("status"), "envace.rehearsal.code": p.get("code"),
                          "envace.rehearsal.confidence": _number(p.get("confidence")),
                          "envace.rehearsal.prediction": p.get("result") if cut.content else None}
            name = "rehearse"
        elif step.role == "gate":
            attributes = {"envace.gate.decision": step.decision, "envace.gate.confidence": step.confidence,
                          "envace.gate.reason": step.reason if cut.content else None}
            name = "gate"
        else:
            result = step.result if isinstance(step.result, dict) else {}
            attributes = {"envace.result.is_error": bool(result.get("is_error")), "envace.call.simulated": step.simulated,
                          "envace.result.error_kind": result.get("error_kind"),
                          "envace.result.latency_s": _number(result.get("latency_s")),
                          "envace.result": _reply(result) if cut.content else None}
            name = "result"
        return name, {k: (v if isinstance(v, (bool, int, float)) else cut.text(v))
                      for k, v in attributes.items() if v is not None}


def _messages(role: str, text: str, key: str, cut: _Cut) -> dict[str, str]:
    """A GenAI `*.messages` attribute: one message with one text part (the conventions' JSON shape)."""
    return {key: json.dumps([{"role": role, "parts": [{"type": "text", "content": cut.text(text)}]}], ensure_ascii=False)}


def _reply(result: dict[str, Any]) -> Any:
    """What the tool answered: its structured content, else its text blocks."""
    if result.get("structured_content") is not None:
        return result["structured_content"]
    blocks = result.get("content") if isinstance(result.get("content"), list) else []
    return "\n".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))


def _number(value: object) -> float | int | None:
    """A number from a recorded (untrusted) field; anything else, or an integer OTLP cannot carry (past
    64 bits), is left out."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if isinstance(value, float) or -(2**63) <= value < 2**63 else None
