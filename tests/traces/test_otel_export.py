"""Recorded runs as OpenTelemetry GenAI spans: a run recorded against a real in-process MCP server,
exported to the SDK's in-memory exporter (names, parentage, attributes, and the call spans' ids equal to
the `traceparent` the server received), and to a stand-in OTLP collector over HTTP, decoded with
opentelemetry-proto, from Python and from `envace traces export`."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations as Hints
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from envace_mcp.errors import EnvaceError, UserError
from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import Step, Trace, TraceStore, record_run
from envace_mcp.traces.context import parse, span_id, trace_id
from envace_mcp.traces.otel import export_otel

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
ENVACE = [sys.executable, "-m", "envace_mcp.cli"]
CONTENT_KEYS = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments",
                "gen_ai.tool.call.result", "envace.gate.reason", "envace.rehearsal.prediction", "envace.result")


def notes() -> MCPServer:
    """A read-only lookup and a delete that fails for a note it lacks; each keeps the `traceparent` it got."""
    server = MCPServer("notes", log_level="WARNING")
    server.traceparents = {}  # type: ignore[attr-defined]

    @server.tool(annotations=Hints(read_only_hint=True))
    async def read_note(id: str, ctx: Context) -> str:
        """A note's text."""
        server.traceparents["read_note"] = (ctx.request_context.meta or {}).get("traceparent")  # type: ignore[attr-defined]
        return f"note {id}: buy milk"

    @server.tool(annotations=Hints(destructive_hint=True))
    async def delete_note(id: str, ctx: Context) -> str:
        """Delete a note."""
        server.traceparents["delete_note"] = (ctx.request_context.meta or {}).get("traceparent")  # type: ignore[attr-defined]
        raise ToolError(f"no note {id}")

    return server


CALLS = ('<tool_call>{"name": "read_note", "arguments": {"id": "n1"}}</tool_call>'
         '<tool_call>{"name": "delete_note", "arguments": {"id": "n9"}}</tool_call>')


@pytest.fixture
def recorded() -> tuple[Trace, dict[str, str]]:
    """One recorded run: two calls in one turn, the delete rehearsed (to succeed), both run for real."""
    import anyio

    async def run() -> tuple[Trace, dict[str, str]]:
        server = notes()
        policy = ScriptedPolicy(act=[CALLS, "Note n9 does not exist."],
                                rehearse=['<execution_result>{"result": "deleted n9"}</execution_result>'])
        async with Toolbox({"notes": server}) as toolbox:
            _, trace = await record_run(create_envace_graph().compile(),
                                        {"messages": [HumanMessage(content="Read n1, then delete n9.")]},
                                        context=EnvaceContext(policy=policy, toolbox=toolbox,
                                                              gate=GateConfig(require_approval="never")))
        policy.assert_complete()
        return trace, server.traceparents  # type: ignore[attr-defined]

    return anyio.run(run)


def by_name(spans) -> dict[str, list]:
    found: dict[str, list] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def test_a_recorded_run_exports_as_genai_spans_whose_call_ids_are_the_traceparents_its_server_got(recorded):
    trace, received = recorded
    exporter = InMemorySpanExporter()
    assert export_otel([trace], exporter) == 6
    spans = by_name(exporter.get_finished_spans())
    (root,) = spans["invoke_agent envace"]
    assert sorted(spans) == ["chat test-double", "execute_tool delete_note", "execute_tool read_note", "invoke_agent envace"]
    assert f"{root.context.trace_id:032x}" == trace_id(trace.run_id) and root.parent is None
    assert f"{root.context.span_id:016x}" == span_id(trace.run_id, "run")
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent" and root.attributes["envace.status"] == "finished"
    assert root.start_time == int(trace.started_at * 1e9) and root.end_time == int(trace.ended_at * 1e9)

    # each call's span is the parent the server was told of: the server's own spans join this one
    for tool in ("read_note", "delete_note"):
        (call,) = spans[f"execute_tool {tool}"]
        assert parse(received[tool]) == (f"{call.context.trace_id:032x}", f"{call.context.span_id:016x}")
        assert call.parent.span_id == root.context.span_id and call.kind == SpanKind.INTERNAL
        assert call.attributes["gen_ai.operation.name"] == "execute_tool" and call.attributes["gen_ai.tool.name"] == tool
        assert root.start_time <= call.start_time <= call.end_time <= root.end_time
    (read,), (delete,) = spans["execute_tool read_note"], spans["execute_tool delete_note"]
    assert read.status.status_code == StatusCode.UNSET and "envace.rehearsal.status" not in read.attributes
    assert [e.name for e in read.events] == ["gate", "result"]
    assert delete.status.status_code == StatusCode.ERROR and delete.attributes["error.type"]
    assert {k: delete.attributes[k] for k in ("envace.rehearsal.status", "envace.gate.decision", "envace.call.ran",
                                              "envace.result.is_error")} == {
        "envace.rehearsal.status": "result", "envace.gate.decision": "execute", "envace.call.ran": True,
        "envace.result.is_error": True}
    assert delete.attributes["envace.comparison.score"] < 1 and [e.name for e in delete.events] == ["rehearse", "gate", "result"]

    # generations: the agent's turns under the run, the rehearsal under the call it rehearsed
    chats = {span.attributes["envace.role"]: span for span in spans["chat test-double"]}
    assert len(spans["chat test-double"]) == 3 and set(chats) == {"act", "rehearse"}
    assert chats["rehearse"].parent.span_id == delete.context.span_id
    assert all(s.parent.span_id == root.context.span_id for s in spans["chat test-double"] if s.attributes["envace.role"] == "act")
    assert all(s.kind == SpanKind.CLIENT and s.attributes["gen_ai.operation.name"] == "chat" for s in spans["chat test-double"])
    # content is opt-in: none of the prompts, arguments or replies without it
    assert not any(key in span.attributes for span in exporter.get_finished_spans() for key in CONTENT_KEYS)


def test_content_is_exported_when_asked_and_cut_to_size():
    trace = next(iter(TraceStore(FIXTURES).read()))
    exporter = InMemorySpanExporter()
    export_otel([trace], exporter, content=True, max_chars=80)
    spans = exporter.get_finished_spans()
    chats = [s for s in spans if s.attributes["gen_ai.operation.name"] == "chat"]
    act = next(s for s in chats if s.attributes["envace.role"] == "act")
    assert act.attributes["gen_ai.usage.input_tokens"] == len(trace.steps[0].prompt_ids)
    assert act.attributes["gen_ai.usage.output_tokens"] == len(trace.steps[0].completion_ids)
    assert act.attributes["gen_ai.request.model"] == trace.model and act.attributes["gen_ai.request.temperature"] == 1.0
    assert '"role": "user"' in act.attributes["gen_ai.input.messages"]
    call = next(s for s in spans if s.attributes["gen_ai.operation.name"] == "execute_tool")
    assert "CHK-2030" in call.attributes["gen_ai.tool.call.arguments"] and call.attributes["gen_ai.tool.call.result"]
    strings = [v for s in spans for v in s.attributes.values() if isinstance(v, str)]
    assert max(len(v) for v in strings if not v.startswith("[")) <= 80 and any(v.endswith("…") for v in strings)


def test_a_failed_run_is_an_error_span_and_hostile_recorded_values_stay_bounded():
    huge = "x" * 100_000
    trace = Trace(run_id="r\x1b[2J", started_at=100.0, ended_at=99.0, status="failed", error="TimeoutError: " + huge,
                  model=huge, steps=[
                      Step(index=0, role="act", time=101.0, sampling={"top_k": 2**80, "seed": True, "temperature": "hot"},
                           prompt_ids=[1] * 5, finish_reason=huge),
                      Step(index=1, role="tool", time=100.5, call_id="c" * 10_000, tool=huge,
                           result={"content": "not a list", "is_error": True, "latency_s": 1e300, "server": 7})])
    exporter = InMemorySpanExporter()
    export_otel([trace], exporter)
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.parent is None)
    assert root.status.status_code == StatusCode.ERROR and root.status.description == "TimeoutError"
    assert root.end_time >= root.start_time and all(s.end_time >= s.start_time for s in spans)
    act = next(s for s in spans if s.attributes.get("envace.role") == "act")
    assert "gen_ai.request.top_k" not in act.attributes and "gen_ai.request.seed" not in act.attributes
    assert all(len(v) <= 4096 for s in spans for v in s.attributes.values() if isinstance(v, str))
    assert all(len(s.name) <= 4096 for s in spans)


# ---------------------------------------------------------------------------- over the wire


class Collector(BaseHTTPRequestHandler):
    """A stand-in OTLP/HTTP collector: each protobuf request on /v1/traces kept, decoded; `fail` answers 400."""

    requests: list[ExportTraceServiceRequest]
    fail: list[bool]

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.fail[0]:
            reply = b"bad batch \x1b[31mred\x1b[0m"
            self.send_response(400)
        elif self.path != "/v1/traces" or self.headers["Content-Type"] != "application/x-protobuf":
            reply = b"not here"
            self.send_response(404)
        else:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            self.requests.append(request)
            reply = b""
            self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


@pytest.fixture
def collector() -> Iterator[tuple[str, list, list]]:
    requests: list = []
    fail = [False]
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (Collector,), {"requests": requests, "fail": fail}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests, fail
    finally:
        server.shutdown()
        server.server_close()


def received_spans(requests) -> list:
    return [span for request in requests for resource in request.resource_spans
            for scope in resource.scope_spans for span in scope.spans]


def test_the_otlp_exporter_sends_the_spans_to_a_collector_over_http(recorded, collector):
    trace, received = recorded
    url, requests, _ = collector
    assert export_otel([trace], url) == 6
    spans = {span.name: span for span in received_spans(requests)}
    resource = requests[0].resource_spans[0].resource
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == "envace-mcp"
    call = spans["execute_tool delete_note"]
    assert parse(received["delete_note"]) == (call.trace_id.hex(), call.span_id.hex())
    assert call.parent_span_id == spans["invoke_agent envace"].span_id
    assert {a.key: a.value for a in call.attributes}["gen_ai.tool.call.id"].string_value == trace.steps_of("tool")[1].call_id
    assert spans["invoke_agent envace"].start_time_unix_nano == int(trace.started_at * 1e9)


def test_envace_traces_export_sends_a_folder_to_a_collector_and_a_refusal_is_one_escaped_line(collector, tmp_path):
    url, requests, fail = collector
    traces = list(TraceStore(FIXTURES).read())
    done = subprocess.run([*ENVACE, "traces", "export", str(FIXTURES), "--otlp", url, "--content"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"of {len(traces)} run(s) to {url}" in done.stdout
    roots = [s for s in received_spans(requests) if s.name == "invoke_agent envace"]
    assert sorted(s.trace_id.hex() for s in roots) == sorted(trace_id(t.run_id) for t in traces)
    assert any(a.key == "gen_ai.input.messages" for s in received_spans(requests) for a in s.attributes)

    fail[0] = True
    done = subprocess.run([*ENVACE, "traces", "export", str(FIXTURES), "--otlp", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: exporting spans failed after 0 of")
    assert "400" in done.stderr and "\x1b" not in done.stderr and len(done.stderr.splitlines()) == 1
    done = subprocess.run([*ENVACE, "traces", "export", str(FIXTURES)], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")})
    assert done.returncode == 2 and "give --otlp URL" in done.stderr


def test_an_endpoint_that_is_no_url_and_a_failed_export_are_clear_errors():
    with pytest.raises(UserError, match="not an http"):
        export_otel([], "localhost:4318")

    class Refusing(InMemorySpanExporter):
        def export(self, spans):
            from opentelemetry.sdk.trace.export import SpanExportResult

            return SpanExportResult.FAILURE

    with pytest.raises(EnvaceError, match="after 0 of 5 were sent: the exporter reported a failure"):
        export_otel(list(TraceStore(FIXTURES).read())[:1], Refusing())


def test_without_the_otel_extra_the_error_names_it(monkeypatch):
    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed: importing it raises ImportError
    with pytest.raises(UserError, match=r"pip install 'envace-mcp\[otel\]'"):
        export_otel([], InMemorySpanExporter())
    with pytest.raises(UserError, match=r"pip install 'envace-mcp\[otel\]'"):
        export_otel([], "http://localhost:4318")
