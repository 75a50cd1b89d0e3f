"""Hostile servers and schemas, from outside: a hand-written JSON-RPC server (`raw_server.py`) and SDK
servers with schemas that try to make the client fetch, recurse, backtrack or hang. Every call ends
as data, quickly; nothing is fetched; a dead server is reported and the others stay usable."""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import pytest
from helpers import children_of, wait_until
from mcp.server.lowlevel import Server
from mcp.types import CallToolResult, ListToolsResult, TextContent, Tool
from probe_server import build as build_probe

from envace_mcp.errors import ConfigError, UserError
from envace_mcp.toolbox import ServerStartError, Toolbox
from envace_mcp.toolbox.config import load_servers

pytestmark = pytest.mark.anyio
RAW = str(Path(__file__).parent / "raw_server.py")


def raw(**behaviour) -> dict:
    return {"command": sys.executable, "args": [RAW, json.dumps(behaviour)]}


def schema_server(schemas: dict[str, dict]) -> Server:
    """A low-level SDK server whose tools have exactly these input schemas (it does not check them)."""
    calls: list[str] = []

    async def list_tools(ctx, params) -> ListToolsResult:
        return ListToolsResult(tools=[Tool(name=name, input_schema=schema) for name, schema in schemas.items()])

    async def call_tool(ctx, params) -> CallToolResult:
        calls.append(params.name)
        return CallToolResult(content=[TextContent(type="text", text=f"ran {params.name}")])

    server = Server("schemas", on_list_tools=list_tools, on_call_tool=call_tool)
    server.calls = calls  # type: ignore[attr-defined]
    return server


class Recorder(BaseHTTPRequestHandler):
    """A slow HTTP endpoint on loopback that counts the requests it gets (an SSRF target)."""

    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        Recorder.hits.append(self.path)
        time.sleep(3)
        body = b'{"type": "string"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def ssrf_target():
    Recorder.hits = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


# ---------------------------------------------------------------------------- 1, 4: references


async def test_schema_references_never_fetch_and_unsafe_ones_refuse_the_call_with_the_reason(ssrf_target, tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"type": "string"}')
    schemas = {
        "remote": {"type": "object", "properties": {"x": {"$ref": f"{ssrf_target}/schema.json"}}},
        "local_file": {"type": "object", "properties": {"x": {"$ref": secret.as_uri()}}},
        "relative": {"type": "object", "properties": {"x": {"$ref": "other.json#/a"}}},
        "dangling": {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
        "itself": {"type": "object", "$ref": "#"},
        "loop": {"type": "object", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
                 "$ref": "#/$defs/a"},
        "tree": {"type": "object", "properties": {"name": {"type": "string"},  # recursion that descends: fine
                                                   "children": {"type": "array", "items": {"$ref": "#"}}},
                 "required": ["name"]},
        "anchored": {"$defs": {"n": {"$anchor": "num", "type": "integer"}}, "type": "object",
                     "properties": {"x": {"$ref": "#num"}}},
    }
    server = schema_server(schemas)
    with anyio.fail_after(20):
        async with Toolbox({"s": server}, timeout=1) as toolbox:
            problems = "\n".join(toolbox.problems)
            results = {name: await toolbox.call(name, {"x": "v", "name": "n"}) for name in schemas}
            tree_ok = await toolbox.call("tree", {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]})
            tree_bad = await toolbox.call("tree", {"name": "a", "children": [{"children": []}]})
            anchored_bad = await toolbox.call("anchored", {"x": "seven"})
    assert Recorder.hits == []  # nothing was fetched, ever
    for name, why in [("remote", "refers outside itself"), ("local_file", "refers outside itself"),
                      ("relative", "refers outside itself"), ("dangling", "dangling"), ("itself", "cycle"),
                      ("loop", "cycle")]:
        result = results[name]
        assert result.error_kind == "invalid_arguments" and why in result.text and "refused" in result.text, name
        assert f"tool {name!r}" in problems and why in problems
    assert set(server.calls) == {"tree"}  # refused calls never reached the server
    assert not tree_ok.is_error and tree_bad.error_kind == "invalid_arguments" and "children[0].name" in tree_bad.text
    assert results["anchored"].error_kind == "invalid_arguments" and anchored_bad.error_kind == "invalid_arguments"


async def test_an_unsafe_schema_in_a_graph_run_is_a_rejected_call_not_a_failed_run():
    from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
    from envace_mcp.testing import ScriptedPolicy

    server = schema_server({"itself": {"type": "object", "$ref": "#"}})
    policy = ScriptedPolicy(act=['<tool_call>{"name": "itself", "arguments": {}}</tool_call>', "gave up"])
    async with Toolbox({"s": server}) as toolbox:
        out = await create_envace_graph().compile().ainvoke({"messages": [("user", "go")]},
                                                            context=EnvaceContext(policy=policy, toolbox=toolbox,
                                                                                  gate=GateConfig(rehearse="none",
                                                                                                  require_approval="never")))
    assert out["status"] == "finished" and out["rehearsals"][0]["decision"] == "reject"
    assert "cycle" in out["rehearsals"][0]["reason"] and server.calls == []


# ---------------------------------------------------------------------------- 2: ReDoS


async def test_a_catastrophic_pattern_fails_its_argument_quickly_and_other_tasks_keep_running():
    schemas = {"redos": {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|a)*$"}}},
               "keys": {"type": "object", "patternProperties": {"^(a|a)*$": {"type": "integer"}},
                        "additionalProperties": False},
               "fine": {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"}}}}
    server = schema_server(schemas)
    late: list[float] = []

    async def ticker(stop: anyio.Event) -> None:
        while not stop.is_set():
            before = time.monotonic()
            await anyio.sleep(0.01)
            late.append(time.monotonic() - before - 0.01)

    async with Toolbox({"s": server}, timeout=1) as toolbox:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker, stop)
            await anyio.sleep(0.05)  # the ticker is running
            started = time.monotonic()
            slow = await toolbox.call("redos", {"s": "a" * 40 + "b"})
            keys = await toolbox.call("keys", {"a" * 40 + "b": 1})
            spent = time.monotonic() - started
            await anyio.sleep(0.05)
            stop.set()
        good = await toolbox.call("fine", {"s": "ABC-12"})
        bad = await toolbox.call("fine", {"s": "abc"})
    assert slow.error_kind == "invalid_arguments" and "in time" in slow.text
    assert keys.error_kind == "invalid_arguments" and "in time" in keys.text
    assert spent < 0.5 and max(late) < 0.3  # stdlib re: several seconds on the loop for this pattern
    assert not good.is_error and bad.error_kind == "invalid_arguments" and "does not match" in bad.text
    assert server.calls == ["fine"]


# ---------------------------------------------------------------------------- 3: stderr


async def test_a_server_flooding_stderr_costs_a_bounded_tail_and_leaves_no_file():
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "envace-*")))
    async with Toolbox({"flood": raw(stderr_mb=20)}) as toolbox:
        assert (await toolbox.call("echo", {})).text == "ok echo"
        conn = toolbox._connections["flood"]
        # the call's own line comes after the flood on the same pipe: wait until the reader has it too
        assert wait_until(lambda: conn._stderr.total >= 20 * 1024 * 1024
                          and toolbox.server_log("flood").endswith("call echo\n"), 20), toolbox.server_log("flood")[-200:]
        assert len(conn._stderr._buffer) <= conn._stderr.LIMIT
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "envace-*"))) == before


# ---------------------------------------------------------------------------- 5: start-up deadlines


@pytest.mark.parametrize("phase", ["initialize", "tools/list"])
async def test_a_server_that_hangs_while_starting_is_left_out_and_the_others_work(phase):
    me = os.getpid()
    before = children_of(me)
    started = time.monotonic()
    with anyio.fail_after(30):
        async with Toolbox({"hung": raw(hang=phase), "probe": build_probe()}, startup_timeout=2) as toolbox:
            opened = time.monotonic() - started
            assert "echo" in toolbox.catalog and (await toolbox.call("echo", {"text": "hi", "count": 1})).text
            [problem] = toolbox.problems
            assert "'hung' did not start within 2 s" in problem
    assert opened < 6
    assert wait_until(lambda: children_of(me) <= before, 10)  # the hung server was stopped, not orphaned


async def test_a_required_server_or_the_only_one_that_hangs_fails_the_open_at_its_deadline():
    with anyio.fail_after(30):
        with pytest.raises(ServerStartError, match="did not start within 1 s"):
            async with Toolbox({"hung": {**raw(hang="initialize"), "required": True}, "probe": build_probe()},
                               startup_timeout=1):
                pass
        with pytest.raises(ServerStartError, match="did not start within 1 s"):
            async with Toolbox({"hung": raw(hang="tools/list")}, startup_timeout=1):
                pass


async def test_a_restart_that_hangs_is_given_up_on_at_the_start_up_deadline_too(tmp_path):
    tools = [{"name": "exit", "inputSchema": {"type": "object"}}, {"name": "echo", "inputSchema": {"type": "object"}}]
    server = raw(tools=tools, calls={"exit": "exit"}, hang_if_exists=str(tmp_path / "started-once"))
    async with Toolbox({"flaky": server}, timeout=5, startup_timeout=1) as toolbox:
        died = await toolbox.call("exit", {})
        with anyio.fail_after(15):
            started = time.monotonic()
            again = await toolbox.call("echo", {})  # the restart hangs in initialize
            spent = time.monotonic() - started
    assert died.error_kind == "server_died"
    assert again.error_kind == "server_died" and "did not start within 1 s" in again.text and spent < 5


async def test_a_silent_http_endpoint_is_given_up_on_at_the_deadline():
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    port = listener.getsockname()[1]
    try:
        with anyio.fail_after(30):
            async with Toolbox({"silent": {"url": f"http://127.0.0.1:{port}/mcp", "startup_timeout": 1},
                                "probe": build_probe()}) as toolbox:
                assert "'silent' did not start within 1 s" in toolbox.problems[0]
                assert not (await toolbox.call("echo", {"text": "x", "count": 1})).is_error
    finally:
        listener.close()


# ---------------------------------------------------------------------------- 8: listings


async def test_a_tool_listed_twice_or_without_a_name_is_left_out_and_reported_not_raised():
    tools = [{"name": "echo", "inputSchema": {"type": "object"}}, {"name": "echo", "inputSchema": {"type": "object"}},
             {"name": "", "inputSchema": {"type": "object"}}, {"name": "other", "inputSchema": {"type": "object"}}]
    async with Toolbox({"dup": raw(tools=tools)}) as toolbox:
        assert sorted(toolbox.catalog.names) == ["echo", "other"]
        assert (await toolbox.call("echo", {})).text == "ok echo"
        problems = " | ".join(toolbox.problems)
    assert "'echo' twice" in problems and "empty name" in problems


# ---------------------------------------------------------------------------- 12: config


@pytest.mark.parametrize(("entry", "message"), [
    ({"command": "srv", "disabled": "false"}, "'disabled' must be true or false"),
    ({"command": "srv", "url": "http://127.0.0.1:9/mcp"}, "both 'command'"),
    ({"command": "srv", "timeout": "5"}, "timeout"),
    ({"command": "srv", "args": "--port 1"}, "args"),
    ({"command": "srv", "startup_timeout": 0}, "startup_timeout"),
    ({"command": "srv", "required": "yes"}, "required"),
])
def test_ambiguous_or_mistyped_config_entries_are_config_errors(entry, message):
    with pytest.raises(ConfigError, match=message):
        load_servers({"mcpServers": {"x": entry}})


@pytest.mark.parametrize("timeout", [-1, 0, "5", True])
async def test_a_timeout_that_is_not_a_positive_number_is_refused(timeout):
    with pytest.raises(UserError, match="greater than 0"):
        Toolbox({"probe": build_probe()}, timeout=timeout)
    async with Toolbox({"probe": build_probe()}) as toolbox:
        with pytest.raises(UserError, match="greater than 0"):
            await toolbox.call("echo", {"text": "x", "count": 1}, timeout=timeout)


# ---------------------------------------------------------------------------- 6, 7: unreadable replies


async def test_a_byte_that_is_not_utf8_on_stdout_does_not_wedge_the_session():
    async with Toolbox({"raw": raw(calls={"echo": "bad_byte"})}, timeout=5) as toolbox:
        with anyio.fail_after(10):
            first = await toolbox.call("echo", {})
            later = [await toolbox.call("echo", {}) for _ in range(3)]
    assert not first.is_error and first.text == "caf\ufffd"  # the bad byte, replaced
    assert [r.text for r in later] == ["ok echo"] * 3


@pytest.mark.parametrize("depth", [400, 50_000])  # 50,000: too deep for json.loads too
async def test_a_reply_nested_too_deep_to_read_fails_its_call_at_once_and_the_next_call_works(depth, caplog):
    tools = [{"name": "deep", "inputSchema": {"type": "object"}}, {"name": "echo", "inputSchema": {"type": "object"}}]
    async with Toolbox({"raw": raw(tools=tools, calls={"deep": f"deep:{depth}"})}, timeout=20) as toolbox:
        started = time.monotonic()
        deep = await toolbox.call("deep", {})
        spent = time.monotonic() - started
        after = await toolbox.call("echo", {})
    assert deep.error_kind == "tool_error" and "unreadable reply" in deep.text and spent < 5  # was: 20 s, timeout
    assert after.text == "ok echo"
    assert not any(r.exc_info for r in caplog.records if r.name == "mcp.client.stdio")  # one line, no traceback


# ---------------------------------------------------------------------------- fuzz


def _fuzz_arguments(rng):
    from raw_server import fuzz_value

    roll = rng.random()
    if roll < 0.1:
        return rng.choice([None, [], "text", 3])
    return {rng.choice(["p0", "p1", "a", "s", "x"]): fuzz_value(rng) for _ in range(rng.randrange(4))} | (
        {"s": "a" * rng.randrange(60) + "b"} if rng.random() < 0.3 else {})


@pytest.mark.slow
async def test_a_thousand_random_hostile_schemas_and_replies_never_raise_never_hang_and_leave_no_orphan():
    import random

    from envace_mcp.toolbox import ToolResult

    me = os.getpid()
    before = children_of(me)
    rng = random.Random(20)
    kinds: dict[str, int] = {}
    calls = 0
    # eight servers of 125 tools (a catalog holds at most MAX_CATALOG_TOOLS = 128): 1,000 schemas, each
    # called once with random arguments
    for seed in range(1, 9):
        async with Toolbox({"fuzz": raw(fuzz_seed=seed, fuzz_tools=125)}, timeout=0.5) as toolbox:
            names = toolbox.catalog.names
            assert len(names) == 125
            for name in names:
                with anyio.fail_after(5):  # the call's own deadline is 0.5 s
                    result = await toolbox.call(name, _fuzz_arguments(rng))
                assert isinstance(result, ToolResult)
                kinds[result.error_kind or "ok"] = kinds.get(result.error_kind or "ok", 0) + 1
                calls += 1
    assert calls == 1000
    # every kind of outcome occurred; a server that broke its session (replies to unknown ids, ...) was restarted
    assert kinds.get("ok", 0) > 30 and kinds.get("invalid_arguments", 0) > 100 and kinds.get("timeout", 0) > 0
    assert kinds.get("tool_error", 0) > 30
    assert wait_until(lambda: children_of(me) <= before, 10)


async def test_a_listing_the_sdk_cannot_read_leaves_that_server_out_with_a_short_reason():
    tools = [{"name": "echo", "inputSchema": {"type": "object"}}] + [
        {"name": f"bad{i}", "inputSchema": {"type": "object", "properties": []}} for i in range(20)]
    async with Toolbox({"bad": raw(tools=tools), "probe": build_probe()}) as toolbox:
        [problem] = toolbox.problems
        assert "echo" in toolbox.catalog.names and "bad0" not in toolbox.catalog.names
    assert "'bad' failed to start" in problem and "more lines" in problem and len(problem.splitlines()) <= 6
