"""Record scripted agent sessions against the inventory server as a JSONL call log.

Stands in for the log of a real agent using your own server: each episode is a user's request and
the 2-7 calls an agent made for it, reads first, then writes, with the mistakes agents make (over-
reserving without checking stock, a typo in a sku, cancelling twice, shipping a cancelled
reservation). Every result is what the server returned (`content`, `structuredContent`, `isError`).
One line per episode, the shape `envace traces import` reads:

    {"id": "s0-ep0000", "task": "...", "calls": [{"tool": "get_item", "arguments": {...}, "result": {...}}, ...]}

Episodes are independent and replayable: episode k of `--seed s` runs against a fresh warehouse of
seed `world_seed(s, k)` (in-process by default; with `--servers examples/inventory.json` a new server
process per episode, with `INVENTORY_SEED` set).

    python examples/inventory_traffic.py --episodes 300 --seed 0 --out inventory_log.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from envace_mcp import Toolbox
from envace_mcp.toolbox import load_servers

sys.path.insert(0, str(Path(__file__).parent))
from inventory_server import CATALOG, CUSTOMERS, SHELF_CAPACITY, build_server  # noqa: E402

CARELESS = 0.6
"""Chance that the agent skips a check it should make before a write; with this warehouse's stock it
makes about 30 % of writes fail, the share issue 51 asks of its held-out evidence."""
WRITES = {"reserve", "cancel_reservation", "ship", "restock"}


def world_seed(seed: int, episode: int) -> int:
    """The warehouse seed of one episode: a new world each episode, so no answer can be memorised."""
    return seed * 1_000_000 + episode


class Session:
    """One episode's calls, recorded as the server answered them."""

    def __init__(self, toolbox: Toolbox) -> None:
        self.toolbox = toolbox
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, tool: str, **arguments: Any) -> dict[str, Any] | None:
        """The call's structured content, or `None` when the server answered with an error."""
        result = await self.toolbox.call(tool, arguments)
        if result.error_kind not in (None, "tool_error"):  # made by the toolbox, not an answer of the server
            raise RuntimeError(f"{tool}{arguments}: {result.error_kind}: {result.text}")
        answer: dict[str, Any] = {"content": result.content, "isError": result.is_error}
        if result.structured_content is not None:
            answer["structuredContent"] = result.structured_content
        self.calls.append({"tool": tool, "arguments": arguments, "result": answer})
        return None if result.is_error else result.structured_content


def typo(sku: str, rng: random.Random) -> str:
    head, digits = sku.split("-")
    return f"{head}-{digits[::-1]}" if digits[::-1] != digits and rng.random() < 0.5 else f"{head}-{digits[:-1]}"


def category(sku: str) -> str:
    return CATALOG[sku][1]


async def reserve_flow(call: Session, rng: random.Random, careless: bool) -> str:
    sku, customer = rng.choice(sorted(CATALOG)), rng.choice(CUSTOMERS)
    name, quantity, by_name = CATALOG[sku][0], rng.randint(1, 8), rng.random() < 0.4
    then = rng.choice(["ship", "hold", "total"])
    ask = f"{quantity} of the {name}" if by_name else f"{quantity} x {sku} ({name})"
    task = {"ship": f"Reserve {ask} for {customer} and ship them.", "hold": f"Please put {ask} on hold for {customer}.",
            "total": f"Reserve {ask} for {customer} and tell me the total."}[then]
    # a user who names the item only makes the agent list its category to find the sku
    listing = await call("list_items", category=category(sku)) if by_name else None
    item = next(i for i in listing["items"] if i["sku"] == sku) if listing else await call("get_item", sku=sku)
    if not careless and (item["discontinued"] or item["available"] < quantity):
        listing = listing or await call("list_items", category=category(sku))
        spare = [i["sku"] for i in listing["items"] if i["available"] >= quantity and not i["discontinued"]]
        if spare:
            sku = spare[0]
        elif not item["discontinued"] and item["available"] > 0:
            quantity = item["available"]
        else:
            return task
    elif careless and rng.random() < 0.4:
        await call("reserve", sku=typo(sku, rng), quantity=quantity, customer=customer)
    held = await call("reserve", sku=sku, quantity=quantity, customer=customer)
    if held and then == "ship":
        await call("ship", reservation_id=held["id"])
    if held and (then == "total" or rng.random() < 0.3):
        await call("get_reservation", reservation_id=held["id"])
    if held and then == "ship" and rng.random() < 0.3:
        await call("get_item", sku=sku)  # how many are left
    return task


async def two_customers(call: Session, rng: random.Random, careless: bool) -> str:
    sku, (first, second) = rng.choice(sorted(CATALOG)), rng.sample(CUSTOMERS, 2)
    q1, q2 = rng.randint(1, 5), rng.randint(1, 5)
    task = f"Reserve {q1} x {sku} for {first} and {q2} for {second}, then ship both."
    item = await call("get_item", sku=sku)
    if not careless and (item["discontinued"] or item["available"] < q1):
        await call("list_items", category=category(sku))  # to offer the user something else
        return task
    if careless and rng.random() < 0.4:
        await call("reserve", sku=typo(sku, rng), quantity=q1, customer=first)
    held = await call("reserve", sku=sku, quantity=q1, customer=first)
    if not careless:
        q2 = min(q2, held["available"])  # the first reply says what is left
    other = await call("reserve", sku=sku, quantity=q2, customer=second) if q2 else None
    for res in (held, other):
        if res:
            await call("ship", reservation_id=res["id"])
    if rng.random() < 0.5:
        await call("get_item", sku=sku)
    return task


async def change_of_mind(call: Session, rng: random.Random, careless: bool) -> str:
    sku, customer = rng.choice(sorted(CATALOG)), rng.choice(CUSTOMERS)
    task = f"Hold 1 x {sku} for {customer}. Actually {customer} changed their mind, cancel that."
    item = await call("get_item", sku=sku)
    if not careless and (item["discontinued"] or item["available"] < 1):
        await call("list_items", category=category(sku))
        return task
    held = await call("reserve", sku=sku, quantity=1, customer=customer)
    if held:
        await call("cancel_reservation", reservation_id=held["id"])
        if careless:  # loses track of what it did: cancels again, or ships the cancelled hold
            await call(rng.choice(["cancel_reservation", "ship"]), reservation_id=held["id"])
    return task


async def existing_reservation(call: Session, rng: random.Random, careless: bool) -> str:
    rid, action = f"RSV-{rng.randint(1001, 1002)}", rng.choice(["ship", "cancel_reservation"])  # every world has both
    task = f"{'Ship' if action == 'ship' else 'Cancel'} reservation {rid}."
    res = await call("get_reservation", reservation_id=rid)
    if careless or res["status"] == "reserved":
        await call(action, reservation_id=rid)
    await call("get_item", sku=res["sku"])
    return task


async def restock_flow(call: Session, rng: random.Random, careless: bool) -> str:
    sku, quantity = rng.choice(sorted(CATALOG)), rng.choice([5, 10, 12, 20, 24, 40, 50])
    task = f"We received {quantity} units of {sku}; put them in stock."
    item = await call("get_item", sku=sku)
    if not careless:
        if item["discontinued"]:
            await call("list_items", category=category(sku))
            return task
        quantity = min(quantity, SHELF_CAPACITY - item["on_hand"])  # what fits; the rest goes back
    if await call("restock", sku=sku, quantity=quantity) and rng.random() < 0.5:
        await call("get_item", sku=sku)
    return task


SCENARIOS = [(reserve_flow, 5), (two_customers, 2), (change_of_mind, 2), (existing_reservation, 2), (restock_flow, 2)]


async def play(toolbox: Toolbox, rng: random.Random, careless: float = CARELESS) -> tuple[str, list[dict[str, Any]]]:
    """One episode on a fresh server: the user's task and the calls made for it."""
    scenario = rng.choices([s for s, _ in SCENARIOS], weights=[w for _, w in SCENARIOS])[0]
    call = Session(toolbox)
    task = await scenario(call, rng, rng.random() < careless)
    return task, call.calls


async def record(episodes: int, seed: int, servers: str | Mapping[str, Any] | None = None,
                 careless: float = CARELESS) -> list[dict[str, Any]]:
    """`episodes` log lines; with `servers` (an mcpServers config with one stdio entry), each episode
    launches that server with `INVENTORY_SEED` set to its warehouse."""
    stdio = [*load_servers(servers).items()][0] if servers else None
    rng, lines = random.Random(seed), []
    for k in range(episodes):
        world = world_seed(seed, k)
        if stdio:
            name, spec = stdio
            target = {name: spec.model_copy(update={"env": {**(spec.env or {}), "INVENTORY_SEED": str(world)}})}
        else:
            target = {"inventory": build_server(world)}
        async with Toolbox(target) as toolbox:
            task, calls = await play(toolbox, rng, careless)
        lines.append({"id": f"s{seed}-ep{k:04d}", "task": task, "calls": calls})
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("inventory_log.jsonl"))
    parser.add_argument("--servers", help="an mcpServers config with one stdio entry (default: the server in-process)")
    parser.add_argument("--careless", type=float, default=CARELESS, help="chance an episode's agent skips its checks")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    lines = anyio.run(record, args.episodes, args.seed, args.servers, args.careless)
    args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    writes = [c for line in lines for c in line["calls"] if c["tool"] in WRITES]
    failed = sum(c["result"]["isError"] for c in writes)
    calls = sum(len(line["calls"]) for line in lines)
    print(f"{len(lines)} episodes, {calls} calls, {failed}/{len(writes)} writes failed "
          f"({failed / max(len(writes), 1):.0%}) -> {args.out} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
