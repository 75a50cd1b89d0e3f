"""A warehouse inventory MCP server: items, reservations, shipping and restocking.

Written the way you would write your own server with the MCP Python SDK (no envace-mcp imports):
typed tools whose return types become `outputSchema` (so replies carry `structuredContent`),
annotations on every tool, and business failures raised as `ToolError` (an `isError` result whose
text says what went wrong). Most failures depend on the warehouse's state, not on the arguments:
reserving more than is available, shipping a cancelled reservation, cancelling one twice.

The state lives in the process and is built from a seed, so a fresh process (or `build_server(seed)`
in-process) is a fresh, reproducible warehouse. envace-mcp never trained on this server: it is the
held-out server of `examples/inventory_traffic.py`.

    python examples/inventory_server.py                       # stdio; seed from INVENTORY_SEED, else 0
    python examples/inventory_server.py --seed 7 --transport http --port 8010
"""

from __future__ import annotations

import argparse
import os
import random
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

Category = Literal["kitchen", "office", "outdoor", "lighting"]
CATALOG: dict[str, tuple[str, Category, float]] = {  # sku: (name, category, list price)
    "KIT-101": ("Blue Ceramic Mug", "kitchen", 12.0), "KIT-102": ("Steel Kettle", "kitchen", 39.0),
    "KIT-103": ("Oak Cutting Board", "kitchen", 28.0), "KIT-104": ("Chef Knife", "kitchen", 64.0),
    "KIT-105": ("Glass Teapot", "kitchen", 24.0), "OFF-201": ("Desk Lamp Arm", "office", 45.0),
    "OFF-202": ("Ergonomic Chair", "office", 289.0), "OFF-203": ("Standing Desk", "office", 449.0),
    "OFF-204": ("Paper Tray", "office", 9.5), "OFF-205": ("Whiteboard", "office", 79.0),
    "OUT-301": ("Camping Tent", "outdoor", 189.0), "OUT-302": ("Hiking Backpack", "outdoor", 95.0),
    "OUT-303": ("Folding Chair", "outdoor", 35.0), "OUT-304": ("Water Bottle", "outdoor", 18.0),
    "OUT-305": ("Sleeping Bag", "outdoor", 120.0), "LGT-401": ("LED Bulb Pack", "lighting", 15.0),
    "LGT-402": ("Floor Lamp", "lighting", 110.0), "LGT-403": ("String Lights", "lighting", 22.0),
    "LGT-404": ("Reading Light", "lighting", 31.0), "LGT-405": ("Solar Lantern", "lighting", 27.0),
}
SHELF_CAPACITY = 60
"""Units one sku may have on hand: a restock past it is refused, so restocking can fail on state too."""
CUSTOMERS = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana"]

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
ADD = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
# a second cancel or ship of the same reservation fails and changes nothing: idempotent in the spec's sense
FINAL = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)


class Item(BaseModel):
    sku: str
    name: str
    category: Category
    unit_price: float
    on_hand: int
    reserved: int
    available: int
    discontinued: bool


class ItemList(BaseModel):
    category: Category | None
    count: int
    items: list[Item]


class Reservation(BaseModel):
    id: str
    sku: str
    item_name: str
    customer: str
    quantity: int
    unit_price: float
    total: float
    status: Literal["reserved", "shipped", "cancelled"]


class ReservationChange(Reservation):
    on_hand: int
    """The item's units on hand after the change."""
    available: int
    """The item's units on hand and not reserved after the change."""


class Restock(BaseModel):
    sku: str
    name: str
    added: int
    on_hand: int
    available: int


Sku = Annotated[str, Field(description="Stock keeping unit, e.g. 'KIT-101'", min_length=1)]
ReservationId = Annotated[str, Field(description="Reservation id, e.g. 'RSV-1003'", min_length=1)]


def initial_state(seed: int) -> tuple[dict[str, Item], dict[str, Reservation]]:
    """The warehouse of `seed`: prices, stock, two discontinued items and a few earlier reservations."""
    rng = random.Random(seed)
    discontinued = set(rng.sample(sorted(CATALOG), 2))
    def stock() -> int:  # some items out, some low, most plenty: enough for requests to fail on stock
        return 0 if rng.random() < 0.15 else rng.randint(1, 6) if rng.random() < 0.4 else rng.randint(5, 30)

    items = {sku: Item(sku=sku, name=name, category=category, unit_price=round(price * rng.uniform(0.8, 1.2), 2),
                       on_hand=stock(), reserved=0, available=0, discontinued=sku in discontinued)
             for sku, (name, category, price) in CATALOG.items()}
    reservations: dict[str, Reservation] = {}
    for n in range(1001, 1001 + rng.randint(2, 5)):
        item = rng.choice([i for i in items.values() if i.on_hand - i.reserved >= 1])
        quantity = rng.randint(1, item.on_hand - item.reserved)
        status = rng.choice(["reserved", "reserved", "shipped", "cancelled"])
        reservations[f"RSV-{n}"] = Reservation(
            id=f"RSV-{n}", sku=item.sku, item_name=item.name, customer=rng.choice(CUSTOMERS), quantity=quantity,
            unit_price=item.unit_price, total=round(quantity * item.unit_price, 2), status=status)
        item.reserved += quantity if status == "reserved" else 0
    for item in items.values():
        item.available = item.on_hand - item.reserved
    return items, reservations


def build_server(seed: int = 0) -> MCPServer:
    """A fresh warehouse server whose state starts from `seed`."""
    items, reservations = initial_state(seed)
    server = MCPServer("inventory", instructions="Warehouse inventory: look items up, reserve, ship, cancel, restock.",
                       version="1.0.0", log_level="WARNING")

    def item(sku: str) -> Item:
        if sku not in items:
            raise ToolError(f"No item with SKU '{sku}'")
        return items[sku]

    def reservation(reservation_id: str) -> Reservation:
        if reservation_id not in reservations:
            raise ToolError(f"No reservation '{reservation_id}'")
        return reservations[reservation_id]

    def change(res: Reservation) -> ReservationChange:
        stock = items[res.sku]
        stock.available = stock.on_hand - stock.reserved
        return ReservationChange(**res.model_dump(), on_hand=stock.on_hand, available=stock.available)

    @server.tool(annotations=READ)
    def list_items(category: Category | None = None) -> ItemList:
        """List the items of the warehouse, or of one category, with price and stock."""
        found = [i for i in items.values() if category in (None, i.category)]
        return ItemList(category=category, count=len(found), items=found)

    @server.tool(annotations=READ)
    def get_item(sku: Sku) -> Item:
        """Get one item: name, price, units on hand, reserved and available."""
        return item(sku)

    @server.tool(annotations=READ)
    def get_reservation(reservation_id: ReservationId) -> Reservation:
        """Get a reservation and its status (reserved, shipped or cancelled)."""
        return reservation(reservation_id)

    @server.tool(annotations=ADD)
    def reserve(sku: Sku, quantity: Annotated[int, Field(ge=1, le=100)],
                customer: Annotated[str, Field(min_length=1, max_length=60)]) -> ReservationChange:
        """Hold units of an item for a customer. Fails if the item is discontinued or not enough units are available."""
        stock = item(sku)
        if stock.discontinued:
            raise ToolError(f"{sku} ({stock.name}) is discontinued and cannot be reserved")
        if quantity > stock.available:
            raise ToolError(f"Only {stock.available} of {sku} ({stock.name}) available (on hand {stock.on_hand}, "
                            f"reserved {stock.reserved}); cannot reserve {quantity}")
        new_id = f"RSV-{1001 + len(reservations)}"
        reservations[new_id] = Reservation(
            id=new_id, sku=sku, item_name=stock.name, customer=customer, quantity=quantity,
            unit_price=stock.unit_price, total=round(quantity * stock.unit_price, 2), status="reserved")
        stock.reserved += quantity
        return change(reservations[new_id])

    @server.tool(annotations=FINAL)
    def cancel_reservation(reservation_id: ReservationId) -> ReservationChange:
        """Cancel a reservation and release its units. Shipped or cancelled reservations cannot be cancelled."""
        res = reservation(reservation_id)
        if res.status != "reserved":
            raise ToolError(f"Reservation {reservation_id} is already {res.status}; only reserved ones can be "
                            "cancelled")
        res.status = "cancelled"
        items[res.sku].reserved -= res.quantity
        return change(res)

    @server.tool(annotations=FINAL)
    def ship(reservation_id: ReservationId) -> ReservationChange:
        """Ship a reservation: its units leave the warehouse. Only reserved (not cancelled or shipped) ones ship."""
        res = reservation(reservation_id)
        if res.status != "reserved":
            raise ToolError(f"Reservation {reservation_id} is {res.status}; only reserved ones can be shipped")
        res.status = "shipped"
        items[res.sku].reserved -= res.quantity
        items[res.sku].on_hand -= res.quantity
        return change(res)

    @server.tool(annotations=ADD)
    def restock(sku: Sku, quantity: Annotated[int, Field(ge=1, description="Units received (positive)")]) -> Restock:
        """Add received units to an item's stock. Fails past the shelf capacity or for discontinued items."""
        stock = item(sku)
        if stock.discontinued:
            raise ToolError(f"{sku} ({stock.name}) is discontinued; it cannot be restocked")
        if stock.on_hand + quantity > SHELF_CAPACITY:
            raise ToolError(f"Restocking {quantity} of {sku} would put {stock.on_hand + quantity} on a shelf that holds "
                            f"{SHELF_CAPACITY} (on hand {stock.on_hand})")
        stock.on_hand += quantity
        stock.available = stock.on_hand - stock.reserved
        return Restock(sku=sku, name=stock.name, added=quantity, on_hand=stock.on_hand, available=stock.available)

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Warehouse inventory MCP server (an envace-mcp example)")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("INVENTORY_SEED", "0")),
                        help="seed of the initial warehouse (default: $INVENTORY_SEED or 0)")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=8010, help="HTTP port (127.0.0.1 only: there is no authentication)")
    args = parser.parse_args(argv)
    server = build_server(args.seed)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
