"""Recorded runs as OpenTelemetry spans in the GenAI semantic conventions, for any OTLP backend
(Jaeger, Tempo, Honeycomb, Langfuse, Phoenix, LangSmith's OTLP endpoint, ...).

    export_otel(TraceStore("traces/").read(), "http://localhost:4318")   # OTLP/HTTP protobuf
    export_otel(traces, InMemorySpanExporter(), content=True)            # any SpanExporter

The spans (their names, parentage, ids, times and attributes) are made by `traces.otel_spans.to_spans`;
this module sends them, checked batch by batch, and is the `otel` format of `envace traces export`
(`OtelExporter`). The OpenTelemetry SDK and OTLP exporter are the `otel` extra, imported when used.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from envace_mcp.errors import EnvaceError, UserError
from envace_mcp.traces.exporting import Exporter, ExportSummary, register_exporter
from envace_mcp.traces.otel_spans import MAX_CHARS, OTEL_EXTRA, to_spans
from envace_mcp.traces.schema import Trace

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["MAX_CHARS", "BATCH", "OtelExporter", "export_otel", "otlp_exporter", "to_spans"]

BATCH = 512
"""Spans per OTLP request: the exporter's own batch size, far below collectors' request limits."""


def otlp_exporter(endpoint: str | None = None, *, headers: dict[str, str] | None = None,
                  timeout: float = 10.0) -> SpanExporter:
    """An OTLP/HTTP protobuf span exporter for `endpoint`: a collector's base address
    (`http://host:4318`, `/v1/traces` is added) or its full traces URL; None: the standard
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT` variables (and their headers)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise UserError(f"exporting to an OTLP endpoint needs the OTLP/HTTP exporter: {OTEL_EXTRA}") from exc
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UserError(f"OTLP endpoint {endpoint!r} is not an http(s) URL (e.g. http://localhost:4318)")
        if parts.path in ("", "/"):
            endpoint = endpoint.rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint, headers=headers, timeout=timeout)


def export_otel(traces: Iterable[Trace], exporter_or_endpoint: SpanExporter | str | None = None, *,
                content: bool = False, max_chars: int = MAX_CHARS, service_name: str = "envace-mcp") -> int:
    """Export recorded runs as spans to a `SpanExporter` or an OTLP endpoint URL (`otlp_exporter`;
    None: the standard environment variables); returns how many spans were sent. A failed export
    is an `EnvaceError` saying why (the exporter's own complaint, quoted)."""
    exporter = exporter_or_endpoint
    made_here = exporter is None or isinstance(exporter, str)
    if made_here:
        exporter = otlp_exporter(exporter)
    spans = to_spans(traces, content=content, max_chars=max_chars, service_name=service_name)
    complaints = _Complaints()
    otlp_logger = logging.getLogger("opentelemetry.exporter")
    otlp_logger.addHandler(complaints)
    propagate, otlp_logger.propagate = otlp_logger.propagate, False  # quoted in our error, never printed raw
    try:
        from opentelemetry.sdk.trace.export import SpanExportResult

        for start in range(0, len(spans), BATCH):
            if exporter.export(spans[start: start + BATCH]) is not SpanExportResult.SUCCESS:
                why = complaints.why()
                raise EnvaceError(f"exporting spans failed after {start} of {len(spans)} were sent: {why[:500]}")
    finally:
        otlp_logger.removeHandler(complaints)
        otlp_logger.propagate = propagate
        if made_here:  # its HTTP session; a caller's exporter stays the caller's to shut down
            exporter.shutdown()
    return len(spans)


@register_exporter
class OtelExporter(Exporter):
    """`export_otel` as an `Exporter`: the runs as spans to `ExportConfig.endpoint` (None: the standard
    `OTEL_EXPORTER_OTLP_*` variables), their content only with `ExportConfig.content`."""

    name = "otel"
    takes = frozenset({"endpoint", "content"})

    def check(self) -> None:
        super().check()
        if self.config.endpoint is None and not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                                                 or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
            raise UserError("where to? give --otlp URL (e.g. http://localhost:4318), or set OTEL_EXPORTER_OTLP_ENDPOINT")

    def export(self, traces: Sequence[Trace]) -> ExportSummary:
        spans = export_otel(traces, self.config.endpoint, content=self.config.content)
        where = self.config.endpoint or "the endpoint in OTEL_EXPORTER_OTLP_*"
        return ExportSummary(spans, f"exported {spans} span(s) of {len(traces)} run(s) to {where}")


class _Complaints(logging.Handler):
    """What the exporter logged (it logs why a request failed, then returns FAILURE): its first complaint
    names the cause (a refused connection, the endpoint's answer), its last why it gave up."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:  # noqa: BLE001 - a malformed log record must not hide the failure it reports
            self.messages.append(str(record.msg))

    def why(self) -> str:
        if not self.messages:
            return "the exporter reported a failure"
        first, last = self.messages[0], self.messages[-1]
        return last if first == last else f"{first[:300]} ... {last[:200]}"
