"""One toolbox over MCP servers of both protocol eras: 2026-07-28 (stateless: discover, no handshake,
no session id, cacheable listings, any JSON as structured content, JSON Schema 2020-12) beside the
2025 handshake, over stdio and streamable HTTP, and servers that lie about which era they speak."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp.server import Server
import mcp_types as types

from envace_mcp.envs.launch import free_port, wait_for_port
from envace_mcp.toolbox import Toolbox, ToolResult
from envace_mcp.toolbox.validation import ArgumentValidator, SchemaValidator

pytestmark = pytest.mark.anyio

SERVERS = Path(__file__).parent.parent / "servers"
sys.path.insert(0, str(SERVERS))

from era_server import OLD, ORDER, SHAPE_OUTPUT, SHAPES  # noqa: E402


def stdio(era: str, log: Path, ttl_ms: int = 0) -> dict:
    return {"command": sys.executable, "args": [str(SERVERS / "era_server.py"), era, "stdio"],
            "env": {"ERA_LOG": str(log), "ERA_TTL_MS": str(ttl_ms)}}


def raw(mode: str, log: Path) -> dict:
    return {"command": sys.executable, "args": [str(SERVERS / "era_raw.py"), mode], "env": {"ERA_LOG": str(log)}}


def wire(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def protocol(toolbox: Toolbox, server: str) -> str | None:
    return toolbox.protocol(server)


def tools_lists(log: Path) -> int:
    """tools/list requests the server received (over HTTP: on the wire; over stdio: handled)."""
    return sum(1 for e in wire(log) if e.get("method", e.get("http_method")) == "tools/list"
               and ("http_method" in e or "version" in e))


@pytest.fixture
def http_servers(tmp_path):
    procs, urls = [], {}
    for era in ("modern", "legacy"):
        port = free_port()
        log = tmp_path / f"http-{era}.jsonl"
        proc = subprocess.Popen([sys.executable, str(SERVERS / "era_server.py"), era, "http", str(port)],
                                env={**os.environ, "ERA_LOG": str(log)}, stderr=subprocess.DEVNULL)
        procs.append(proc)
        wait_for_port(port, proc, 30)
        urls[era] = (f"http://127.0.0.1:{port}/mcp", log)
    try:
        yield urls
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


async def test_one_toolbox_speaks_2026_statelessly_and_2025_with_the_handshake_over_stdio_and_http(tmp_path, http_servers):
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("ms", "ls")}
    config = {"ms": stdio("modern", logs["ms"]), "ls": stdio("legacy", logs["ls"]),
              "mh": {"url": http_servers["modern"][0]}, "lh": {"url": http_servers["legacy"][0], "headers": {"X-T": "1"}}}
    logs |= {"mh": http_servers["modern"][1], "lh": http_servers["legacy"][1]}
    async with Toolbox(config) as toolbox:
        versions = {name: protocol(toolbox, name) for name in config}
        results = {name: await toolbox.call(f"{name}_order", {"kind": "order", "lines": [{"sku": "ABC-1", "qty": 2}]})
                   for name in config}
    assert versions == {"ms": "2026-07-28", "mh": "2026-07-28", "ls": "2025-11-25", "lh": "2025-11-25"}
    assert not any(r.is_error for r in results.values()), results
    for name in ("ms", "mh"):  # stateless: discover, never initialize, no session id either way
        methods = [e.get("method", e.get("http_method")) for e in wire(logs[name])]
        assert methods[0] == "server/discover" and "initialize" not in methods and "tools/call" in methods
    modern_http = wire(logs["mh"])
    assert all(e.get("session") is None for e in modern_http) and not any("issued_session" in e for e in modern_http)
    assert all(e["protocol_header"] == "2026-07-28" for e in modern_http if "http_method" in e)
    assert "initialize" in [e.get("method") for e in wire(logs["ls"])]
    legacy_http = wire(logs["lh"])
    issued = {e["issued_session"] for e in legacy_http if "issued_session" in e}
    calls = [e for e in legacy_http if e.get("http_method") == "tools/call"]
    assert len(issued) == 1 and calls and calls[0]["session"] in issued


async def test_a_listing_inside_its_ttl_is_not_fetched_again_by_a_restart_or_a_relist(tmp_path):
    log = tmp_path / "ms.jsonl"
    async with Toolbox({"ms": stdio("modern", log, ttl_ms=60_000)}, timeout=10) as toolbox:
        conn = toolbox._connections["ms"]
        await conn.relist()
        died = await toolbox.call("die", {})
        after = await toolbox.call("order", {"kind": "order", "lines": [{"sku": "ABC-1", "qty": 1}]})
        assert died.error_kind == "server_died" and not after.is_error and toolbox.restarts("ms") == 1
        assert tools_lists(log) == 1  # start, re-list and restart: one tools/list, the rest from the cache
        await toolbox.call("grow", {})  # the server says its list changed (a subscriptions/listen event)
        with anyio.fail_after(10):
            while tools_lists(log) < 2 or "extra" not in [t.remote_name for t in conn.tools]:
                await anyio.sleep(0.02)
        # the catalog is rebuilt from the new listing when a call next routes to that server
        assert not (await toolbox.call("order", {"kind": "order", "lines": [{"sku": "ABC-1", "qty": 1}]})).is_error
        assert "extra" in toolbox.catalog and not (await toolbox.call("extra", {})).is_error
    assert tools_lists(log) == 2


async def test_a_listing_past_its_ttl_or_without_one_is_fetched_again(tmp_path):
    short, legacy = tmp_path / "short.jsonl", tmp_path / "legacy.jsonl"
    async with Toolbox({"short": stdio("modern", short, ttl_ms=300), "old": stdio("legacy", legacy, ttl_ms=60_000)}) as toolbox:
        await toolbox._connections["short"].relist()
        assert tools_lists(short) == 1
        await anyio.sleep(0.4)
        await toolbox._connections["short"].relist()
        assert tools_lists(short) == 2
        await toolbox._connections["old"].relist()  # a 2025 result carries no caching hints
        assert tools_lists(legacy) == 2
        await toolbox.call("old_grow", {})  # notifications/tools/list_changed on the handshake session
        with anyio.fail_after(10):
            while toolbox.catalog.lookup("old", "extra") is None:  # the catalog follows, no call needed
                await anyio.sleep(0.02)


@pytest.mark.parametrize("kind", sorted(set(SHAPES) - {"null"}))
async def test_structured_content_of_any_json_type_reaches_the_result_its_text_and_its_json(tmp_path, kind):
    async with Toolbox({"ms": stdio("modern", tmp_path / "ms.jsonl")}) as toolbox:
        result = await toolbox.call("shape", {"kind": kind})
        spec = toolbox.catalog["shape"]
    assert not result.is_error and result.structured_content == SHAPES[kind] and result.value == SHAPES[kind]
    assert json.loads(result.text) == SHAPES[kind]
    assert ToolResult.model_validate_json(result.model_dump_json()) == result
    assert spec.output_schema == SHAPE_OUTPUT and spec.output_validator.errors(result.value) == []


async def test_a_null_structured_content_is_no_structured_content_and_fails_an_output_schema_as_data(tmp_path):
    # the SDK's server leaves a null `structuredContent` off the wire, and its client then refuses a
    # result without one from a tool that declares an output schema
    async with Toolbox({"ms": stdio("modern", tmp_path / "ms.jsonl")}) as toolbox:
        result = await toolbox.call("shape", {"kind": "null"})
    assert result.error_kind == "tool_error" and "did not return structured content" in result.text


def test_an_output_schema_that_is_not_an_object_checks_any_json_value():
    validator = SchemaValidator(SHAPE_OUTPUT)
    assert [validator.errors(v) for v in ([1], "s", 2, None, {"a": []})] == [[]] * 5
    assert validator.errors(["x"]) and validator.errors({"b": 1})
    assert SchemaValidator({"type": "array", "prefixItems": [{"const": 1}]}).errors([2])


@pytest.mark.parametrize(("arguments", "field"), [
    ({"kind": "order", "lines": [{"sku": "ABC-1", "qty": 1}]}, None),
    ({"kind": "cart", "lines": [{"sku": "ABC-1", "qty": 1}]}, "kind"),  # const
    ({"kind": "order", "lines": [{"sku": "abc", "qty": 1}]}, "lines[0].sku"),  # $defs/$ref
    ({"kind": "order", "lines": [{"sku": "ABC-1", "qty": 1, "x": 1}]}, "lines[0]"),  # unevaluatedProperties
    ({"kind": "order", "lines": [{"sku": "ABC-1", "qty": 1}], "point": [1, "y"]}, "point[1]"),  # prefixItems
    ({"kind": "order", "lines": [{"sku": "ABC-1", "qty": 1}], "point": [1, 2, 3]}, "point"),  # items: false
    ({"kind": "order", "lines": [{"sku": "ABC-1", "qty": 1}], "gift": True}, ""),  # dependentRequired
    ({"kind": "order", "lines": [{"sku": "ABC-1", "qty": 1}], "memo": "x"}, ""),  # unevaluatedProperties
])
def test_arguments_are_checked_by_json_schema_2020_12(arguments, field):
    errors = ArgumentValidator(ORDER).errors(arguments)
    assert (errors == []) if field is None else (errors and errors[0]["field"] == field), errors


def test_a_draft_07_schema_is_still_checked_as_draft_07():
    validator = ArgumentValidator(OLD)
    assert validator.refusal is None and validator.schema_error is None
    assert validator.errors({"n": 1, "pair": ["a", 2]}) == []
    assert validator.errors({"n": -1})[0]["field"] == "n"  # definitions/$ref
    assert validator.errors({"n": 1, "pair": ["a", "b"]})[0]["field"] == "pair[1]"  # tuple items


def hostile_server() -> Server:
    schemas = {
        "loop": {"type": "object", "$dynamicAnchor": "node", "anyOf": [{"$dynamicRef": "#node"}]},
        "remote": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                   "$defs": {"x": {"$ref": "https://evil.example/x.json"}}, "properties": {"a": {"$ref": "#/$defs/x"}}},
    }

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=[types.Tool(name=n, input_schema=s) for n, s in schemas.items()])

    async def call_tool(ctx, params):
        return types.CallToolResult(content=[types.TextContent(text="ran")])

    return Server("hostile", on_list_tools=list_tools, on_call_tool=call_tool)


async def test_a_dynamic_ref_loop_or_a_remote_ref_in_defs_makes_the_tool_refuse_its_calls():
    async with Toolbox({"hostile": hostile_server()}) as toolbox:
        assert protocol(toolbox, "hostile") == "2026-07-28"
        results = {name: await toolbox.call(name, {"a": 1}) for name in ("loop", "remote")}
        problems = toolbox.problems
    assert all(r.error_kind == "invalid_arguments" and "refused" in r.text for r in results.values())
    assert any("'loop'" in p and "cycle" in p for p in problems)
    assert any("'remote'" in p and "evil.example" in p for p in problems)


async def test_a_server_lying_about_its_era_connects_on_the_true_one_or_fails_alone(tmp_path):
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("liar", "future", "garbage", "good")}
    config = {"liar": raw("liar", logs["liar"]), "future": raw("future", logs["future"]),
              "garbage": raw("garbage", logs["garbage"]), "good": stdio("modern", logs["good"])}
    async with Toolbox(config, startup_timeout=20) as toolbox:
        versions = {name: protocol(toolbox, name) for name in config}
        problems = toolbox.problems
        pong = await toolbox.call("liar_ping_raw", {})
        shape = await toolbox.call("shape", {"kind": "array"})
        future = await toolbox.call("future_ping_raw", {})
    assert versions == {"liar": "2025-06-18", "future": None, "garbage": "2025-06-18", "good": "2026-07-28"}
    assert not pong.is_error and shape.structured_content == [1, 2, 3]
    assert future.error_kind == "unknown_tool"
    lie = next(p for p in problems if p.startswith("server 'liar'"))
    assert "claimed protocol 2026-07-28" in lie and "initialize handshake (2025-06-18)" in lie
    failed = next(p for p in problems if "'future'" in p)
    assert "\n" not in failed and "2099-01-01" in failed
    assert [e["method"] for e in wire(logs["liar"])][:3] == ["server/discover", "tools/list", "initialize"]


def output_schema_server() -> Server:
    """Results whose output schemas are costly to check the plain way: a catastrophic `pattern`, and
    `uniqueItems` over thousands of objects (jsonschema compares every pair)."""
    catastrophic = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    unique = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
    listed = [types.Tool(name="evil", input_schema={"type": "object"}, output_schema=catastrophic),
              types.Tool(name="many", input_schema={"type": "object", "properties": {"twice": {"type": "boolean"}}},
                         output_schema=unique)]

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx, params):
        if params.name == "evil":
            value = {"s": "a" * 40 + "!"}  # ~2^40 steps for a backtracking matcher
        else:
            items = [{"id": i, "tags": ["x"]} for i in range(3000)]
            value = {"a": items + [{"tags": ["x"], "id": 7.0}] if (params.arguments or {}).get("twice") else items}
        return types.CallToolResult(content=[types.TextContent(text="ok")], structured_content=value)

    return Server("costly", on_list_tools=list_tools, on_call_tool=call_tool)


async def test_a_results_output_schema_is_checked_with_bounds_so_a_hostile_one_cannot_stall_every_server():
    """The SDK checks structuredContent against the output schema with plain jsonschema (no time bound,
    pairwise `uniqueItems`): on this server that held the shared event loop for hours, past any timeout.
    The toolbox runs the same check through its bounded validator: the results still fail or pass as
    the schema says."""
    async with Toolbox({"costly": output_schema_server()}, timeout=5) as toolbox:
        with anyio.fail_after(30):  # a hang guard: unbounded, the first call alone would not end
            evil = await toolbox.call("evil")
            many = await toolbox.call("many")
            twice = await toolbox.call("many", {"twice": True})
    assert evil.error_kind == "tool_error" and "Invalid structured content" in evil.text and "'s'" in evil.text
    assert not many.is_error and len(many.structured_content["a"]) == 3000
    assert twice.error_kind == "tool_error" and "more than once" in twice.text  # 7.0 is 7, key order aside


def test_unique_items_counts_equality_as_json_schema_does():
    check = SchemaValidator({"type": "array", "uniqueItems": True})
    assert check.errors([1, 1.0]) and check.errors([{"a": 1, "b": 2}, {"b": 2, "a": 1}])
    assert not check.errors([1, True]) and not check.errors([0, False]) and not check.errors([[1], [1, 1]])
    assert not check.errors(["1", 1]) and not check.errors([None, 0])
    assert not check.errors([10**400, 1]) and check.errors([10**400, 10**400])  # past a float's range


def test_what_a_server_says_is_escaped_before_it_is_logged_or_quoted():
    """Warnings (a failed re-list, a server that lied) go through Python's logging, which prints as it
    gets: a server's message reaches them through `_describe`, escaped."""
    from envace_mcp.toolbox._transport import describe as _describe

    text = _describe(RuntimeError("listing failed\x1b[2J\x1b]0;pwned\x07\u202e\nsecond line"))
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b[2J" in text and text.endswith("second line")
