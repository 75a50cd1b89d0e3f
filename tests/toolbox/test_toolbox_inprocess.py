"""The toolbox against real MCP servers running in-process (the fast, real protocol path)."""

import threading

import anyio
import pytest
from mcp.server.mcpserver import MCPServer

from envace_mcp.errors import UserError
from envace_mcp.servers import bank
from envace_mcp.toolbox import InProcessServer, Toolbox, blocking_toolbox
from probe_server import build

pytestmark = pytest.mark.anyio


async def test_the_catalog_carries_schemas_annotations_and_origin():
    async with Toolbox({"mcpServers": {"bank": bank.build_server(), "probe": build()}}) as toolbox:
        transfer = toolbox.catalog["transfer"]
        assert transfer.server == "bank"
        assert transfer.input_schema["required"] == ["from_account_id", "to_account_id", "amount"]
        assert transfer.output_schema and "to_balance" in transfer.output_schema["properties"]
        assert transfer.annotations.destructive and not transfer.annotations.read_only
        assert toolbox.catalog["get_balance"].annotations.read_only
        # the probe's `checkout` has no annotations: spec defaults apply
        checkout = toolbox.catalog["checkout"].annotations
        assert (checkout.read_only, checkout.destructive, checkout.open_world) == (False, True, True)


async def test_a_successful_call_returns_text_and_structured_content():
    async with Toolbox({"probe": build()}) as toolbox:
        result = await toolbox.call("echo", {"text": "ab", "count": 2})
    assert not result.is_error and result.error_kind is None
    assert result.structured_content == {"text": "abab", "count": 2}
    assert '"abab"' in result.text and result.server == "probe"


async def test_invalid_arguments_never_reach_the_server():
    probe = build()
    async with Toolbox({"probe": probe}) as toolbox:
        bad = await toolbox.call("checkout", {"basket": {"customer": "c", "lines": [{"sku": "A", "qty": 0}]}})
        missing = await toolbox.call("echo", {})
        wrong = await toolbox.call("echo", {"text": "x", "count": 9})
        good = await toolbox.call("echo", {"text": "x"})
    assert bad.error_kind == "invalid_arguments" and bad.structured_content["field"] == "basket.lines[0].qty"
    assert "basket.lines[0].qty" in bad.text
    assert missing.structured_content["field"] == "text"
    assert wrong.structured_content["field"] == "count"
    assert not good.is_error
    assert [c["tool"] for c in probe.calls] == ["echo"]


async def test_an_unknown_tool_is_an_error_result_with_suggestions():
    probe = build()
    async with Toolbox({"probe": probe}) as toolbox:
        result = await toolbox.call("ecoh", {"text": "x"})
    assert result.error_kind == "unknown_tool" and "'echo'" in result.text
    assert probe.calls == []


async def test_a_hung_tool_times_out_and_the_toolbox_stays_usable():
    async with Toolbox({"probe": build()}, timeout=30) as toolbox:
        with anyio.fail_after(10):
            hung = await toolbox.call("hang", {}, timeout=0.3)
        assert hung.error_kind == "timeout" and hung.structured_content["timeout_s"] == 0.3
        after = await toolbox.call("echo", {"text": "still here"})
    assert not after.is_error


async def test_tool_errors_keep_their_structured_content():
    async with Toolbox({"probe": build()}) as toolbox:
        refused = await toolbox.call("refuse", {"reason": "limit"})
        exploded = await toolbox.call("explode", {"message": "kaboom"})
    assert refused.is_error and refused.error_kind == "tool_error"
    assert refused.structured_content == {"code": "POLICY", "reason": "limit"}
    assert exploded.error_kind == "tool_error" and "kaboom" in exploded.text


async def test_business_errors_of_a_bundled_server_are_results_not_exceptions():
    async with Toolbox({"bank": bank.build_server()}) as toolbox:
        result = await toolbox.call("get_balance", {"account_id": "NOPE-1"})
    assert result.error_kind == "tool_error" and "Unknown account 'NOPE-1'" in result.text


async def test_deny_and_allow_lists_are_enforced_before_any_call():
    denied_probe = build()
    config = {"probe": InProcessServer(server=denied_probe, exclude_tools=["die", "refuse"])}
    async with Toolbox(config) as toolbox:
        assert "die" not in toolbox.catalog and "echo" in toolbox.catalog
        result = await toolbox.call("refuse", {"reason": "x"})
    assert result.error_kind == "denied"
    assert denied_probe.calls == []
    allow = {"probe": InProcessServer(server=build(), include_tools=["echo"])}
    async with Toolbox(allow) as toolbox:
        assert toolbox.catalog.names == ["echo"]
        assert (await toolbox.call("pid")).error_kind == "denied"


async def test_concurrent_calls_share_one_session_without_mixing_results():
    async with Toolbox({"probe": build()}) as toolbox:
        results = {}

        async def one(i: int) -> None:
            results[i] = await toolbox.call("echo", {"text": f"<{i}>"})

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(one, i)
    assert all(results[i].structured_content["text"] == f"<{i}>" for i in range(50))


async def test_scoped_calls_carry_meta_and_episodes_keep_separate_state():
    server = bank.build_server()
    async with Toolbox({"bank": server, "probe": build()}) as toolbox:
        seen = await toolbox.scoped({"envace/episode": "e1"}).call("whoami")
        assert seen.structured_content == {"envace/episode": "e1"}
        world = server.episodes.state("default")
        chk = next(a for a in world["accounts"].values() if a["type"] == "checking")
        sav = next(a for a in world["accounts"].values() if a["type"] == "savings" and a["owner"] == chk["owner"])
        one, two = toolbox.scoped({"envace/episode": "one"}), toolbox.scoped({"envace/episode": "two"})
        moved = await one.call("transfer", {"from_account_id": chk["id"], "to_account_id": sav["id"], "amount": 10})
        assert not moved.is_error
        b1 = (await one.call("get_balance", {"account_id": chk["id"]})).structured_content["balance"]
        b2 = (await two.call("get_balance", {"account_id": chk["id"]})).structured_content["balance"]
    assert round(b2 - b1, 2) == 10.0


async def test_misuse_raises_a_clear_user_error():
    toolbox = Toolbox({"probe": build()})
    with pytest.raises(UserError, match="not open"):
        await toolbox.call("echo", {"text": "x"})
    async with toolbox:
        with pytest.raises(UserError, match="deadlock"):
            toolbox.call_sync("echo", {"text": "x"})
        with pytest.raises(UserError, match="already open"):
            await toolbox.__aenter__()


def test_synchronous_programs_use_a_blocking_toolbox_from_any_thread():
    with blocking_toolbox({"probe": build()}) as toolbox:
        assert toolbox.call_sync("echo", {"text": "sync"}).structured_content["text"] == "sync"
        out = []
        worker = threading.Thread(target=lambda: out.append(toolbox.call_sync("echo", {"text": "thread"})))
        worker.start()
        worker.join(10)
        assert out[0].structured_content["text"] == "thread"


async def test_calls_from_another_event_loop_are_carried_to_the_toolbox_loop():
    with blocking_toolbox({"probe": build()}) as toolbox:
        result = await toolbox.call("echo", {"text": "cross-loop"})
    assert result.structured_content["text"] == "cross-loop"


async def test_a_call_missing_several_required_arguments_names_each_one():
    server = MCPServer("calendar", log_level="WARNING")
    booked = []

    @server.tool()
    def book_meeting(start: str, end: str, title: str, organizer: str) -> str:
        """Book a meeting."""
        booked.append(title)
        return "booked"

    async with Toolbox({"calendar": server}) as toolbox:
        result = await toolbox.call("book_meeting", {"start": "2026-12-07T09:00"})
    assert result.error_kind == "invalid_arguments" and booked == []
    errors = result.structured_content["errors"]
    assert {e["field"]: e["message"] for e in errors} == {
        "end": "'end' is a required property",
        "title": "'title' is a required property",
        "organizer": "'organizer' is a required property",
    }
    assert result.structured_content["field"] in {"end", "title", "organizer"}
    assert f"field '{result.structured_content['field']}'" in result.text
