"""`envace traces import`: your agents' tool-call logs become traces, answered against the example to-do
server (in-process, and once over stdio as a user runs it from the repository's root)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from envace_mcp.errors import UserError
from envace_mcp.toolbox import InProcessServer, Toolbox, ToolResult, ToolSpec, load_servers
from envace_mcp.traces import TraceStore, load_catalog, mutate_calls, read_log
from envace_mcp.traces.importing import MAX_DEPTH
from envace_mcp.traces.schema import RESULT_CHARS
from envace_mcp.traces.mutating import HUGE, changes
from probe_server import build as build_probe

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
ENVACE = [sys.executable, "-m", "envace_mcp.cli"]
ONLY_T1 = [{"id": "t1", "title": "File my taxes", "priority": "high", "done": False}]


def _todo_module():
    spec = importlib.util.spec_from_file_location("todo_server", EXAMPLES / "todo_server.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its pydantic models resolve their annotations through it
    spec.loader.exec_module(module)
    return module


todo = _todo_module()


def write_log(path: Path, *lines: object) -> Path:
    """A log of these lines: objects as JSON, strings and bytes as they are."""
    raw = b"".join((line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line)).encode())
                   + b"\n" for line in lines)
    path.write_bytes(raw)
    return path


def envace(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: `python` on PATH is this environment's (the example config launches it)."""
    env = {"COLUMNS": "200", "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([*ENVACE, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def todo_catalog() -> list[ToolSpec]:
    """The to-do server's catalog, read through a real in-process MCP session."""
    async def read():
        async with Toolbox({"todo": todo.build_server()}) as toolbox:
            return list(toolbox.catalog)

    return anyio.run(read)


def call_result(value: dict, *, error: bool = False) -> dict:
    return {"content": [{"type": "text", "text": json.dumps(value)}], "structuredContent": value, "isError": error}


TODOS = {"todos": ONLY_T1}


def test_each_episode_becomes_a_finished_real_trace_of_tool_steps_that_ran_with_the_catalog_attached(
        todo_catalog, tmp_path):
    log = write_log(tmp_path / "agent.jsonl",
                    {"id": "ep-1", "task": "Delete my to-do about taxes", "calls": [
                        {"tool": "list_todos", "arguments": {}, "result": call_result(TODOS)},
                        {"tool": "delete_todo", "arguments": {"id": "t1"},
                         "result": {"id": "t1", "title": "File my taxes", "remaining": 0}}]},
                    {"user": "Is t9 done?", "calls": [
                        {"tool": "get_todo", "arguments": '{"id": "t9"}', "error": "no to-do with id 't9'"},
                        {"tool": "add_todo", "arguments": {"title": "x"},
                         "result": {"content": [{"type": "text", "text": "store full"}], "is_error": True,
                                    "structured_content": {"code": "FULL"}}},
                        {"tool": "list_todos", "arguments": {"done": True}, "result": "nothing done yet"}]})
    traces, summary = read_log(log, todo_catalog)
    assert (summary.episodes, summary.calls, summary.errors, summary.skipped) == (2, 5, 2, [])
    first, second = traces
    assert (first.task_id, first.task, second.task_id, second.task) == ("ep-1", "Delete my to-do about taxes",
                                                                        "agent:2", "Is t9 done?")
    assert [t.metadata for t in traces] == [{"source": "agent.jsonl:1"}, {"source": "agent.jsonl:2"}]
    assert all(t.mode == "real" and t.status == "finished" for t in traces)
    assert [tool["name"] for tool in first.tools] == ["list_todos", "get_todo", "add_todo", "delete_todo"]
    assert first.tools[3]["annotations"]["destructive"] and first.tools[0]["annotations"]["read_only"]
    assert first.tools[1]["input_schema"]["required"] == ["id"]
    steps = first.steps + second.steps
    assert all(s.role == "tool" and s.ran and s.decision is None for s in steps)
    assert [(s.index, s.tool) for s in second.steps] == [(0, "get_todo"), (1, "add_todo"), (2, "list_todos")]
    assert second.steps[0].arguments == {"id": "t9"}  # a JSON string of arguments, as OpenAI logs carry them
    listed, deleted = (ToolResult.model_validate(s.result) for s in first.steps)
    assert listed.structured_content == TODOS and json.loads(listed.text) == TODOS and not listed.is_error
    assert listed.server == "todo" and listed.arguments == {}
    assert deleted.structured_content == {"id": "t1", "title": "File my taxes", "remaining": 0}  # the shorthand
    assert json.loads(deleted.text) == deleted.structured_content and deleted.error_kind is None
    missing, full, plain = (ToolResult.model_validate(s.result) for s in second.steps)
    assert (missing.is_error, missing.error_kind, missing.text, missing.structured_content) == (
        True, "tool_error", "no to-do with id 't9'", None)
    assert (full.is_error, full.structured_content, full.text) == (True, {"code": "FULL"}, "store full")
    assert (plain.is_error, plain.text, plain.structured_content) == (False, "nothing done yet", None)
    store = TraceStore(tmp_path / "traces")
    for trace in traces:
        store.append(trace)
    assert [t.model_dump() for t in store.read()] == [t.model_dump() for t in traces] and store.problems == []


def test_malformed_lines_are_reported_by_number_and_the_rest_is_imported(todo_catalog, tmp_path):
    good = {"calls": [{"tool": "get_todo", "arguments": {"id": "t1"}, "result": ONLY_T1[0]}]}
    log = write_log(tmp_path / "log.jsonl",
                    good,                                                                       # 1
                    "{not json",                                                                # 2
                    "[1, 2]",                                                                   # 3
                    {"task": "no calls"},                                                       # 4
                    {"calls": [{"arguments": {}, "result": 1}]},                                # 5
                    {"calls": [{"tool": "get_todo", "arguments": {"id": "t1"}, "result": 1, "error": "x"}]},  # 6
                    {"calls": [good["calls"][0], {"tool": "get_todo", "arguments": {"id": "t1"}}]},  # 7
                    "",                                                                         # 8: blank
                    b'{"calls": "\xff"}',                                                       # 9
                    {"calls": [{"tool": "get_todo", "arguments": [1], "result": 1}]},          # 10
                    {"calls": [{"tool": "get_todo", "arguments": {}, "error": {"code": 1}}]},  # 11
                    {"calls": [{"tool": "get_todo", "result": {"content": ["text"]}}]},         # 12
                    {"id": "last", **good})                                                     # 13
    traces, summary = read_log(log, todo_catalog)
    assert [t.metadata["source"] for t in traces] == ["log.jsonl:1", "log.jsonl:13"]
    reasons = dict(summary.skipped)
    assert sorted(reasons) == [2, 3, 4, 5, 6, 7, 9, 10, 11, 12]
    assert reasons[2].startswith("not JSON") and reasons[3] == "a JSON list, not an episode object"
    assert reasons[4] == "no 'calls' list" and reasons[5] == "call 1 has no 'tool' name"
    assert reasons[6].startswith("call 1 has both 'result' and 'error'")
    assert reasons[7].startswith("call 2 has neither 'result' nor 'error'")  # one bad call skips its whole episode
    assert reasons[9] == "not UTF-8 text" and "'arguments' must be an object" in reasons[10]
    assert "'error' must be the server's message" in reasons[11] and "content blocks" in reasons[12]
    assert summary.episodes == 2 and summary.calls == 2
    report = summary.report()
    assert "skipped 10 line(s): line 2: not JSON" in report[1] and "line 6:" in report[1]
    assert "line 7:" not in report[1] and report[1].endswith("; and 5 more")  # the first few, the rest counted


def test_calls_to_unknown_tools_are_skipped_and_counted_and_schema_breaking_ones_kept(todo_catalog, tmp_path):
    log = write_log(tmp_path / "log.jsonl",
                    {"calls": [{"tool": "frobnicate", "arguments": {}, "result": 1},
                               {"tool": "get_todo", "arguments": {"id": 5}, "error": "id must be a string"},
                               {"tool": "frobnicate", "arguments": {}, "error": "x"}]},
                    {"calls": [{"tool": "zap", "arguments": {}, "result": 1}]})
    traces, summary = read_log(log, todo_catalog)
    [trace] = traces
    assert [(s.index, s.tool, s.arguments) for s in trace.steps] == [(0, "get_todo", {"id": 5})]
    assert summary.unknown_tools == {"frobnicate": 2, "zap": 1} and summary.invalid_arguments == 1
    assert summary.skipped == [(2, "no call to a tool the catalog has (only zap (1))")]
    report = "\n".join(summary.report())
    assert "1 call(s) kept whose arguments break their tool's input schema" in report
    assert "skipped 3 call(s) to tools the catalog lacks: frobnicate (2), zap (1)" in report


def test_a_log_with_nothing_to_import_is_one_error_line_and_exit_code_2(todo_catalog, tmp_path):
    empty = write_log(tmp_path / "empty.jsonl", "", "  ")
    broken = write_log(tmp_path / "broken.jsonl", "nope", {"calls": [{"tool": "zap", "arguments": {}, "result": 1}]})
    with pytest.raises(UserError, match="is empty"):
        read_log(empty, todo_catalog)
    with pytest.raises(UserError, match=r"no episode imported from its 2 line\(s\) \(line 1: not JSON"):
        read_log(broken, todo_catalog)
    catalog = tmp_path / "tools.json"
    catalog.write_text(json.dumps([spec.to_dict() for spec in todo_catalog]))
    for log, says in ((empty, "is empty"), (broken, "calls to tools the catalog lacks: zap (1)")):
        out = envace("traces", "import", str(log), "--catalog", str(catalog), "--out", str(tmp_path / "out"))
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1 and says in out.stderr
    assert not (tmp_path / "out").exists()  # a refused import leaves no folder behind


def test_a_saved_catalog_stands_in_for_live_servers(todo_catalog, tmp_path):
    listed = {"tools": [{"name": "get_todo", "description": "Get one",
                         "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
                         "annotations": {"readOnlyHint": True}}]}  # tools/list's result
    (tmp_path / "listed.json").write_text(json.dumps(listed))
    [spec] = load_catalog(tmp_path / "listed.json")
    assert spec.name == "get_todo" and spec.annotations.read_only and spec.input_schema["required"] == ["id"]
    (tmp_path / "tools.json").write_text(json.dumps([spec.to_dict() for spec in todo_catalog]))  # servers ls --json
    log = write_log(tmp_path / "log.jsonl", {"calls": [{"tool": "get_todo", "arguments": {"id": "t1"}, "result": ONLY_T1[0]},
                                                       {"tool": "delete_todo", "arguments": {"id": "t1"}, "error": "no"}]})
    out = envace("traces", "import", str(log), "--catalog", str(tmp_path / "tools.json"), "--out", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    assert "imported 1 episode(s) with 2 call(s), 1 of them errors" in out.stdout
    [trace] = TraceStore(tmp_path / "out").read()
    assert trace.tools == [spec.to_dict() for spec in todo_catalog]
    assert [s.result["is_error"] for s in trace.steps] == [False, True]
    for bad, says in (("[]", "lists no tools"), ('{"x": 1}', "must be a JSON list of tools"), ("[{}]", "tool 1: a tool needs a name")):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(UserError, match=says):
            load_catalog(tmp_path / "bad.json")


def test_the_catalog_or_the_servers_one_of_them_and_mutation_needs_the_servers(tmp_path):
    log = write_log(tmp_path / "log.jsonl", {"calls": [{"tool": "get_todo", "arguments": {"id": "t1"}, "result": 1}]})
    (tmp_path / "tools.json").write_text(json.dumps([{"name": "get_todo"}]))
    neither = envace("traces", "import", str(log), "--out", str(tmp_path / "out"))
    both = envace("traces", "import", str(log), "--out", str(tmp_path / "out"), "--catalog", str(tmp_path / "tools.json"),
                  "--servers", str(EXAMPLES / "todo.json"))
    mutating = envace("traces", "import", str(log), "--out", str(tmp_path / "out"), "--catalog",
                      str(tmp_path / "tools.json"), "--mutate", "2")
    for out in (neither, both):
        assert out.returncode == 2 and "--servers CONFIG.json (live servers) or --catalog FILE" in out.stderr
    assert mutating.returncode == 2 and "--mutate replays calls against live servers: it needs --servers" in mutating.stderr
    assert all(o.stderr.count("\n") == 1 for o in (neither, both, mutating)) and not (tmp_path / "out").exists()


def test_each_kind_of_argument_gets_the_wrong_values_agents_write_that_its_schema_accepts():
    spec = ToolSpec.from_dict({"name": "t", "inputSchema": {"type": "object", "properties": {
        "count": {"type": "integer"}, "page": {"type": "integer", "minimum": 1}, "kind": {"enum": ["a", "b", "c"]},
        "flag": {"type": "boolean"}, "name": {"type": "string", "maxLength": 3}, "ratio": {"type": "number"},
        "tags": {"type": "array"}}}})
    arguments = {"count": 5, "page": 2, "kind": "a", "flag": True, "name": "ab1", "ratio": 0.5, "tags": ["x"]}
    found = changes(arguments, spec, {"name": ["ab1", "xyz", "toolong"]}, random.Random(0))
    assert found["count"] == [0, -5, HUGE] and found["page"] == [HUGE]  # 0 and -2 break `minimum`: never made
    assert found["kind"] == ["b", "c"] and found["flag"] == [False] and found["ratio"] == [0.0, -0.5, float(HUGE)]
    assert "xyz" in found["name"] and "toolong" not in found["name"] and "tags" not in found
    [typo] = [v for v in found["name"] if v != "xyz"]
    assert typo[:2] == "ab" and typo[2].isdigit() and typo != "ab1"  # the last character, another of its kind


@pytest.mark.anyio
async def test_a_changed_argument_is_replayed_after_the_earlier_calls_and_fails_for_real(tmp_path):
    server = todo.build_server(ONLY_T1)
    log = write_log(tmp_path / "log.jsonl", {"id": "ep", "task": "Delete taxes", "calls": [
        {"tool": "list_todos", "arguments": {}, "result": TODOS},
        {"tool": "delete_todo", "arguments": {"id": "t1"}, "result": {"id": "t1", "title": "File my taxes", "remaining": 0}}]})
    async with Toolbox({"todo": InProcessServer(server=server, sandbox=True)}) as toolbox:
        [trace], _ = read_log(log, toolbox.catalog)
        none, _ = await mutate_calls([trace], toolbox, per_episode=0)
        [variant], summary = await mutate_calls([trace], toolbox, per_episode=3, seed=0)
    assert none == []
    listed, deleted = variant.steps
    new = deleted.arguments["id"]
    assert (listed.tool, listed.arguments, deleted.tool) == ("list_todos", {}, "delete_todo") and new != "t1"
    assert ToolResult.model_validate(listed.result).structured_content == TODOS  # the earlier call ran for real
    assert deleted.result["is_error"] and ToolResult.text_of(deleted.result).endswith(f"no to-do with id {new!r}")
    assert "t1" in server.todos  # the logged delete itself was not replayed; only the changed one ran
    assert variant.metadata == {"source": "log.jsonl:1", "mutated_from": trace.run_id, "mutation": f'id: "t1" → "{new}"',
                                "call": "call_1", "diverged": []}
    assert (variant.task_id, variant.task, variant.mode, variant.tools) == ("ep", "Delete taxes", "real", trace.tools)
    assert all(s.ran for s in variant.steps) and variant.run_id != trace.run_id
    assert (summary.variants, summary.errors, summary.unchangeable, summary.not_sandbox) == (1, 1, 1, 0)
    assert summary.report()[0] == "mutated 1 call(s) and replayed each against its sandbox: 1 of the changed calls failed for real"


@pytest.mark.anyio
async def test_only_sandbox_servers_are_replayed_against_and_the_rest_is_counted(tmp_path):
    probe, server = build_probe(), todo.build_server(ONLY_T1)
    echo = {"tool": "echo", "arguments": {"text": "hi"}, "result": {"text": "hi", "count": 1}}
    delete = {"tool": "delete_todo", "arguments": {"id": "t1"}, "result": {"id": "t1", "title": "x", "remaining": 0}}
    log = write_log(tmp_path / "log.jsonl", {"calls": [echo, delete]}, {"calls": [delete, echo]})
    async with Toolbox({"todo": InProcessServer(server=server, sandbox=True), "probe": probe}) as toolbox:
        assert not toolbox.specs["probe"].sandbox  # the default: never replayed against
        traces, _ = read_log(log, toolbox.catalog)
        [variant], summary = await mutate_calls(traces, toolbox, per_episode=5)
    assert probe.calls == []  # not even the read-only echo reached the server that is no sandbox
    assert variant.metadata["mutated_from"] == traces[1].run_id and [s.tool for s in variant.steps] == ["delete_todo"]
    assert (summary.not_sandbox, summary.servers, summary.variants) == (3, {"probe"}, 1)  # a delete after an echo too
    assert ('3 call(s) not mutated: they or an earlier call of their episode go to servers not marked "sandbox": true '
            "(probe)") in summary.report()


def test_the_documented_example_imports_and_mutates_over_stdio(tmp_path):
    assert load_servers(EXAMPLES / "todo.json")["todo"].sandbox
    out = envace("traces", "import", "examples/tool_log.jsonl", "--servers", "examples/todo.json",
                 "--out", str(tmp_path / "todo"), "--mutate", "1")
    assert out.returncode == 0, out.stderr
    assert "imported 5 episode(s) with 8 call(s), 1 of them errors, from examples/tool_log.jsonl" in out.stdout
    assert "mutated 5 call(s) and replayed each against its sandbox" in out.stdout
    traces = list(TraceStore(tmp_path / "todo").read())
    originals = {t.run_id: t for t in traces if "mutated_from" not in t.metadata}
    variants = [t for t in traces if "mutated_from" in t.metadata]
    assert len(originals) == 5 and len(variants) == 5
    assert {t.task_id for t in originals.values()} == {"ep-1", "ep-2", "ep-3", "ep-4", "ep-5"}
    assert sum(s.result["is_error"] for t in originals.values() for s in t.steps) == 1
    for variant in variants:
        original = originals[variant.metadata["mutated_from"]]
        changed = variant.steps[-1]
        logged = next(s for s in original.steps if s.call_id == changed.call_id)
        differing = [k for k in logged.arguments if logged.arguments[k] != changed.arguments.get(k)]
        assert len(differing) == 1 and changed.tool == logged.tool  # one argument changed, nothing else
    assert any(v.steps[-1].result["is_error"] and "no to-do with id" in ToolResult.text_of(v.steps[-1].result)
               for v in variants)


def test_text_from_the_log_never_reaches_the_terminal_raw(todo_catalog, tmp_path):
    hostile = "evil\x1b[2J\x1b]0;pwned\x07\u202e"
    (tmp_path / "tools.json").write_text(json.dumps([spec.to_dict() for spec in todo_catalog]))
    log = write_log(tmp_path / "log.jsonl",
                    {"calls": [{"tool": "get_todo", "arguments": {"id": "t1"}, "error": f"gone {hostile}"},
                               {"tool": hostile, "arguments": {}, "result": 1}]})
    only_hostile = write_log(tmp_path / "only.jsonl", {"calls": [{"tool": hostile, "arguments": {}, "error": hostile}]})
    out = envace("traces", "import", str(log), "--catalog", str(tmp_path / "tools.json"), "--out", str(tmp_path / "out"))
    refused = envace("traces", "import", str(only_hostile), "--catalog", str(tmp_path / "tools.json"),
                     "--out", str(tmp_path / "out"))
    assert out.returncode == 0 and refused.returncode == 2
    for text in (out.stdout + out.stderr, refused.stdout + refused.stderr):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert "evil\\x1b[2J\\x1b]0;pwned\\x07\\u202e" in text  # shown, escaped
    [trace] = TraceStore(tmp_path / "out").read()
    assert ToolResult.text_of(trace.steps[0].result) == f"gone {hostile}"  # the data itself is kept as the server sent it


def nested(levels: int) -> str:
    """`levels` arrays and objects inside each other, as JSON text (too deep for `json.dumps` to write)."""
    return "".join('{"a": [' for _ in range(levels // 2)) + "1" + "".join("]}" for _ in range(levels // 2))


def test_a_line_nested_too_deep_to_store_is_skipped_and_reported_and_the_rest_imported(todo_catalog, tmp_path):
    """Arguments or a result nested hundreds or thousands of levels parsed, but could not be stored (the
    trace's JSON is written no deeper than pydantic's limit): one such line stopped the whole import."""
    good = json.dumps({"calls": [{"tool": "get_todo", "arguments": {"id": "t1"}, "result": ONLY_T1[0]}]})
    (tmp_path / "tools.json").write_text(json.dumps([spec.to_dict() for spec in todo_catalog]))
    lines = [good]
    for levels in (300, 900, 5_000):
        lines += ['{"calls": [{"tool": "get_todo", "arguments": {"id": "t1", "x": %s}, "result": 1}]}' % nested(levels),
                  '{"calls": [{"tool": "get_todo", "arguments": {"id": "t1"}, "result": {"v": %s}}]}' % nested(levels),
                  '{"calls": [{"tool": "get_todo", "arguments": %s, "result": 1}]}' % json.dumps(
                      '{"id": "t1", "x": %s}' % nested(levels))]  # a JSON string of arguments, as OpenAI logs carry them
    log = write_log(tmp_path / "log.jsonl", *lines, good)
    traces, summary = read_log(log, todo_catalog)
    assert [t.metadata["source"] for t in traces] == ["log.jsonl:1", "log.jsonl:11"]
    assert [number for number, _ in summary.skipped] == list(range(2, 11))
    assert all(why.endswith(f"nested deeper than {MAX_DEPTH} levels") for _, why in summary.skipped), summary.skipped
    out = envace("traces", "import", str(log), "--catalog", str(tmp_path / "tools.json"), "--out", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    assert "imported 2 episode(s) with 2 call(s)" in out.stdout and "skipped 9 line(s): line 2: nested" in out.stdout
    stored = TraceStore(tmp_path / "out")
    assert [t.metadata["source"] for t in stored.read()] == ["log.jsonl:1", "log.jsonl:11"] and stored.problems == []


def test_a_huge_logged_result_is_stored_once_cut_to_the_limit_and_marked(todo_catalog, tmp_path):
    """A 3 MB listing logged as structured content became its text and its structured content, 6 MB a
    trace; a 2 MB error message was stored whole. Each keeps `RESULT_CHARS`, once, marked as cut."""
    todos = {"todos": [{"id": f"t{i}", "title": "x" * 90} for i in range(30_000)]}
    log = write_log(tmp_path / "log.jsonl", {"calls": [{"tool": "list_todos", "arguments": {}, "result": todos},
                                                       {"tool": "get_todo", "arguments": {"id": "t1"}, "error": "e" * 2_000_000},
                                                       {"tool": "get_todo", "arguments": {"id": "t1"}, "result": ONLY_T1[0]}]})
    [trace], _ = read_log(log, todo_catalog)
    store = TraceStore(tmp_path / "traces")
    store.append(trace)
    [stored] = TraceStore(tmp_path / "traces").read()
    listed, failed, small = (ToolResult.model_validate(s.result) for s in stored.steps)
    text = json.dumps(todos, indent=2, ensure_ascii=False)
    assert listed.structured_content is None and listed.content[0]["text"] == text[:RESULT_CHARS]
    assert listed.truncated == {"content_chars": len(text), "structured_chars": len(json.dumps(todos, ensure_ascii=False)),
                                "kept_chars": RESULT_CHARS}
    assert failed.is_error and failed.text.startswith("e" * RESULT_CHARS + "\n[") and "2,000,000" in failed.text
    assert failed.truncated == {"content_chars": 2_000_000, "structured_chars": None, "kept_chars": RESULT_CHARS}
    assert small.truncated is None and small.structured_content == ONLY_T1[0]  # within the limit: as the server sent it
    assert (tmp_path / "traces" / "traces.jsonl").stat().st_size < 2 * RESULT_CHARS + 100_000
