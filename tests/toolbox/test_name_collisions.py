"""A server whose tool list collides with another server's prefixed names costs only its own colliding
tools, reported in `problems`: the toolbox opens, and stays usable after a restart brings such a
listing (real in-process servers)."""

from typing import Any

import anyio
import pytest
from mcp import types
from mcp.server.lowlevel import Server

from envace_mcp.toolbox import Toolbox

pytestmark = pytest.mark.anyio
CLASH = ("server 'third': its tool 'bank_transfer' would be named 'bank_transfer', the name of server 'bank''s "
         "'transfer'; it is left out")


def server(name: str, *tools: str, up: bool = True) -> Server:
    """A server listing `tools` (its listing fails while `server.state["up"]` is false); it records the
    tools it ran in `server.calls`."""
    state = {"up": up}
    calls: list[str] = []

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        if not state["up"]:
            raise RuntimeError(f"{name} is down")
        return types.ListToolsResult(tools=[types.Tool(name=t, input_schema={"type": "object"}) for t in tools])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        calls.append(params.name)
        return types.CallToolResult(content=[types.TextContent(text=f"{name} ran {params.name}")])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text="up")])

    built = Server(name, on_list_tools=list_tools, on_call_tool=call_tool, on_read_resource=read_resource)
    built.state, built.calls = state, calls  # type: ignore[attr-defined]
    return built


async def test_a_listing_that_takes_another_servers_prefixed_name_loses_only_that_tool_at_start():
    bank, shop, third = server("bank", "transfer"), server("shop", "transfer"), server("third", "bank_transfer", "ping")
    with anyio.fail_after(30):
        async with Toolbox({"bank": bank, "shop": shop, "third": third}) as toolbox:
            assert toolbox.catalog.names == ["bank_transfer", "shop_transfer", "ping"]
            assert toolbox.catalog["bank_transfer"].server == "bank"
            moved = await toolbox.call("bank_transfer", {})
            pinged = await toolbox.call("ping", {})
            problems = toolbox.problems
    assert moved.text == "bank ran transfer" and pinged.text == "third ran ping"
    assert bank.calls == ["transfer"] and third.calls == ["ping"] and shop.calls == []
    assert [p for p in problems if "bank_transfer" in p] == [CLASH + " (rename one of the servers in the config to keep both)"]


async def test_a_restart_that_brings_a_colliding_listing_costs_that_server_its_tool_not_the_toolbox():
    bank, shop, third = server("bank", "transfer"), server("shop", "transfer"), server("third", "bank_transfer", "ping",
                                                                                       up=False)
    with anyio.fail_after(30):
        async with Toolbox({"bank": bank, "shop": shop, "third": third}) as toolbox:
            assert any(p.startswith("MCP server 'third'") and "third is down" in p for p in toolbox.problems)
            assert toolbox.catalog.names == ["bank_transfer", "shop_transfer"]
            third.state["up"] = True
            assert await toolbox.read_resource("third", "note://status") == "up"  # brings third back
            assert toolbox.restarts("third") == 1
            assert toolbox.catalog.names == ["bank_transfer", "shop_transfer", "ping"]
            moved = await toolbox.call("bank_transfer", {})
            pinged = await toolbox.call("ping", {})
            problems = toolbox.problems
    assert moved.text == "bank ran transfer" and pinged.text == "third ran ping"
    assert bank.calls == ["transfer"] and third.calls == ["ping"]
    assert sum(p.startswith(CLASH) for p in problems) == 1
