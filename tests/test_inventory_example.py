"""The held-out inventory example: a stateful server whose failures depend on its state, and the
scripted traffic that records a replayable JSONL call log from it."""

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from envace_mcp.toolbox import Toolbox

EXAMPLES = Path(__file__).parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

import inventory_server  # noqa: E402
import inventory_traffic  # noqa: E402
from inventory_server import build_server, initial_state  # noqa: E402

pytestmark = pytest.mark.anyio
WRITES = {"reserve", "cancel_reservation", "ship", "restock"}


def stocked_sku(seed: int, at_least: int) -> tuple[str, int]:
    """A sku of the seed's warehouse that can be reserved, with its available units."""
    items, _ = initial_state(seed)
    item = next(i for i in items.values() if i.available >= at_least and not i.discontinued)
    return item.sku, item.available


def stdio_config(seed: int) -> dict:
    """examples/inventory.json as shipped, launched with this interpreter on the seed's warehouse."""
    config = json.loads((EXAMPLES / "inventory.json").read_text())
    entry = config["mcpServers"]["inventory"]
    entry |= {"command": sys.executable, "args": [str(EXAMPLES / "inventory_server.py")],
              "env": {"INVENTORY_SEED": str(seed)}}
    return config


async def test_reserving_more_than_is_available_fails_until_stock_allows_it():
    sku, available = stocked_sku(3, at_least=2)
    async with Toolbox({"inventory": build_server(3)}) as toolbox:
        with anyio.fail_after(10):
            too_many = await toolbox.call("reserve", {"sku": sku, "quantity": available + 1, "customer": "Ana"})
            held = await toolbox.call("reserve", {"sku": sku, "quantity": available, "customer": "Ana"})
            one_more = await toolbox.call("reserve", {"sku": sku, "quantity": 1, "customer": "Ben"})
            await toolbox.call("restock", {"sku": sku, "quantity": 1})
            after_restock = await toolbox.call("reserve", {"sku": sku, "quantity": 1, "customer": "Ben"})
    assert too_many.error_kind == "tool_error" and f"Only {available} of {sku}" in too_many.text
    assert too_many.structured_content is None
    assert not held.is_error and held.structured_content["available"] == 0
    assert held.structured_content["total"] == round(available * held.structured_content["unit_price"], 2)
    # the same arguments fail or succeed depending on what earlier calls did to the stock
    assert one_more.is_error and "Only 0 of" in one_more.text
    assert not after_restock.is_error and after_restock.structured_content["id"] != held.structured_content["id"]


async def test_a_cancelled_reservation_cannot_be_shipped_or_cancelled_again():
    sku, _ = stocked_sku(0, at_least=1)
    async with Toolbox({"inventory": build_server(0)}) as toolbox:
        with anyio.fail_after(10):
            before = (await toolbox.call("get_item", {"sku": sku})).structured_content
            held = (await toolbox.call("reserve", {"sku": sku, "quantity": 1, "customer": "Ana"})).structured_content
            cancelled = await toolbox.call("cancel_reservation", {"reservation_id": held["id"]})
            shipped = await toolbox.call("ship", {"reservation_id": held["id"]})
            twice = await toolbox.call("cancel_reservation", {"reservation_id": held["id"]})
            after = (await toolbox.call("get_item", {"sku": sku})).structured_content
    assert cancelled.structured_content["status"] == "cancelled"
    assert cancelled.structured_content["available"] == before["available"]
    assert shipped.is_error and f"Reservation {held['id']} is cancelled" in shipped.text
    assert twice.is_error and "already cancelled" in twice.text
    assert after == before


async def test_shipping_takes_the_units_out_of_stock_once():
    sku, _ = stocked_sku(0, at_least=2)
    async with Toolbox({"inventory": build_server(0)}) as toolbox:
        with anyio.fail_after(10):
            before = (await toolbox.call("get_item", {"sku": sku})).structured_content
            held = (await toolbox.call("reserve", {"sku": sku, "quantity": 2, "customer": "Ana"})).structured_content
            shipped = await toolbox.call("ship", {"reservation_id": held["id"]})
            again = await toolbox.call("ship", {"reservation_id": held["id"]})
            cancel = await toolbox.call("cancel_reservation", {"reservation_id": held["id"]})
            after = (await toolbox.call("get_item", {"sku": sku})).structured_content
            stored = (await toolbox.call("get_reservation", {"reservation_id": held["id"]})).structured_content
    assert shipped.structured_content["on_hand"] == before["on_hand"] - 2
    assert (after["on_hand"], after["reserved"]) == (before["on_hand"] - 2, before["reserved"])
    assert again.is_error and "is shipped" in again.text
    assert cancel.is_error and "already shipped" in cancel.text
    assert stored["status"] == "shipped" and stored["item_name"] == before["name"]


async def test_restocking_is_refused_past_the_shelf_and_for_discontinued_items():
    items, _ = initial_state(0)
    gone = next(i for i in items.values() if i.discontinued)
    kept = next(i for i in items.values() if not i.discontinued)
    room = inventory_server.SHELF_CAPACITY - kept.on_hand
    async with Toolbox({"inventory": build_server(0)}) as toolbox:
        with anyio.fail_after(10):
            over = await toolbox.call("restock", {"sku": kept.sku, "quantity": room + 1})
            fits = await toolbox.call("restock", {"sku": kept.sku, "quantity": room})
            discontinued = await toolbox.call("restock", {"sku": gone.sku, "quantity": 1})
            unreservable = await toolbox.call("reserve", {"sku": gone.sku, "quantity": 1, "customer": "Ana"})
            unknown = await toolbox.call("get_item", {"sku": "KIT-10"})
            negative = await toolbox.call("restock", {"sku": kept.sku, "quantity": -3})
    assert over.is_error and "shelf" in over.text
    assert fits.structured_content["on_hand"] == inventory_server.SHELF_CAPACITY
    assert discontinued.is_error and unreservable.is_error and "discontinued" in unreservable.text
    assert unknown.is_error and "No item with SKU 'KIT-10'" in unknown.text
    assert negative.error_kind == "invalid_arguments"  # the schema says positive: the server is never asked


async def test_the_tools_declare_their_annotations_and_output_schemas():
    async with Toolbox({"inventory": build_server(0)}) as toolbox:
        catalog = {tool.name: tool for tool in toolbox.catalog}
    declared = {name: (t.annotations.read_only, t.annotations.destructive, t.annotations.idempotent)
                for name, t in catalog.items()}
    assert declared == {
        "list_items": (True, False, True), "get_item": (True, False, True), "get_reservation": (True, False, True),
        "reserve": (False, False, False), "restock": (False, False, False),
        "cancel_reservation": (False, True, True), "ship": (False, True, True),
    }
    assert all(not t.annotations.open_world and t.output_schema for t in catalog.values())
    assert {"id", "total", "available"} <= set(catalog["reserve"].output_schema["properties"])


def test_the_warehouse_is_a_function_of_its_seed():
    items, reservations = initial_state(5)
    assert (items, reservations) == initial_state(5)
    assert items != initial_state(6)[0]
    assert len(items) == 20 and len({i.category for i in items.values()}) == 4
    assert sum(i.discontinued for i in items.values()) == 2 and len(reservations) >= 2
    assert all(i.available == i.on_hand - i.reserved >= 0 for i in items.values())


async def test_the_shipped_config_serves_the_same_warehouse_over_stdio():
    config = stdio_config(4)
    assert config["mcpServers"]["inventory"]["sandbox"] is True
    async with Toolbox(config) as toolbox:
        with anyio.fail_after(30):
            over_stdio = await toolbox.call("list_items", {})
    async with Toolbox({"inventory": build_server(4)}) as toolbox:
        in_process = await toolbox.call("list_items", {})
    assert over_stdio.structured_content == in_process.structured_content
    assert over_stdio.structured_content["count"] == 20


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("inventory") / "log.jsonl"
    run = subprocess.run([sys.executable, str(EXAMPLES / "inventory_traffic.py"), "--episodes", "150", "--seed", "0",
                          "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "150 episodes" in run.stdout and "writes failed" in run.stdout
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_the_traffic_log_has_one_episode_a_line_in_the_import_format(log):
    assert len(log) == 150 and len({e["id"] for e in log}) == 150
    for episode in log:
        assert set(episode) == {"id", "task", "calls"} and episode["task"]
        assert 2 <= len(episode["calls"]) <= 7
        assert episode["calls"][0]["tool"] not in WRITES  # agents look before they write
        for call in episode["calls"]:
            assert set(call) == {"tool", "arguments", "result"} and isinstance(call["arguments"], dict)
            result = call["result"]
            assert result["content"][0]["type"] == "text" and isinstance(result["isError"], bool)
            assert ("structuredContent" in result) is not result["isError"]


def test_about_a_third_of_the_writes_fail_in_episodes_that_also_succeed(log):
    writes = [c for e in log for c in e["calls"] if c["tool"] in WRITES]
    failed = [c for c in writes if c["result"]["isError"]]
    assert 0.2 <= len(failed) / len(writes) <= 0.4
    assert {c["tool"] for c in failed} == WRITES  # every write tool fails somewhere
    mixed = [e for e in log if {c["result"]["isError"] for c in e["calls"]} == {True, False}]
    clean = [e for e in log if not any(c["result"]["isError"] for c in e["calls"])]
    assert len(mixed) >= 20 and len(clean) >= 50
    # most failures come from the state (stock, reservation status), not from a mistyped argument
    typos = [c for c in failed if "No item with SKU" in c["result"]["content"][0]["text"]]
    assert len(typos) < len(failed) / 2


async def test_the_log_replays_exactly_against_a_fresh_server(log):
    for k in (0, 1, 7, 42):
        async with Toolbox({"inventory": build_server(inventory_traffic.world_seed(0, k))}) as toolbox:
            again = inventory_traffic.Session(toolbox)  # recorded as the traffic records
            for call in log[k]["calls"]:
                await again(call["tool"], **call["arguments"])
                assert again.calls[-1] == call, (k, call["tool"])


async def test_the_traffic_is_deterministic_for_a_seed_and_the_same_over_stdio():
    first = await inventory_traffic.record(20, seed=1)
    assert first == await inventory_traffic.record(20, seed=1)
    assert first != await inventory_traffic.record(20, seed=2)
    # a server process per episode, its warehouse chosen by INVENTORY_SEED: the very same log
    assert await inventory_traffic.record(2, seed=1, servers=stdio_config(0)) == first[:2]
