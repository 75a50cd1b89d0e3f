"""W3C trace context for a run: one trace id per run, one span id per step, derived from ids the
trace already keeps, so the `traceparent` a tool call carries to its server (in `_meta`) and the
spans a recorded run exports later (`envace_mcp.traces.otel`) name the same trace and the same
call, without storing anything more. Where the caller's own OpenTelemetry span is active, calls join
that trace instead.

    traceparent("run-1", "call:c1")   # '00-<32 hex>-<16 hex>-01'
"""

from __future__ import annotations

import hashlib
import re

RUN_ID = "envace_run_id"
"""The key of the run's id in LangGraph's config metadata: `record_run` sets it to its trace's `run_id`,
and the graph's calls name that trace in their `traceparent` (`graph.calls.call_meta`)."""

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def _hex(text: str, digits: int) -> str:
    value = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:digits]
    return value if value.strip("0") else "1".rjust(digits, "0")  # all zeros is an invalid id


def trace_id(run_id: str) -> str:
    """The run's 32-hex-digit trace id."""
    return _hex(f"envace-trace:{run_id}", 32)


def span_id(run_id: str, part: str) -> str:
    """The 16-hex-digit span id of one step of the run: `"run"`, `"call:<tool_call_id>"`,
    `"generate:<n>"`, ... (any stable name)."""
    return _hex(f"envace-span:{run_id}:{part}", 16)


def traceparent(run_id: str, part: str) -> str:
    """The `traceparent` header value naming step `part` of run `run_id` as the parent."""
    active = _active_span()
    if active is not None:
        return f"00-{active[0]}-{active[1]}-01"
    return f"00-{trace_id(run_id)}-{span_id(run_id, part)}-01"


def parse(value: object) -> tuple[str, str] | None:
    """(trace id, parent span id) of a well-formed version-00 `traceparent`, else None."""
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT.match(value)
    if match is None or not match.group(1).strip("0") or not match.group(2).strip("0"):
        return None
    return match.group(1), match.group(2)


def _active_span() -> tuple[str, str] | None:
    """The trace and span id of the caller's active OpenTelemetry span, when OpenTelemetry is installed
    and a recording span is current."""
    try:
        from opentelemetry import trace as otel_trace
    except ImportError:
        return None
    context = otel_trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"
