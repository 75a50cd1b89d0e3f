"""Retail orders MCP server (τ²-retail-like): users, orders, items; cancel, return, exchange, address.

Server-enforced rules: only pending orders can be cancelled or re-addressed; only delivered orders
can be returned or exchanged; exchanges stay within the same product and need an available variant;
refunds go to the original payment method or one of the user's gift cards. Rules the agent must
keep itself (as in τ²): act only for the authenticated user, and no returns after the return window.

    python -P -m envace_mcp.servers.retail                      # stdio
    python -P -m envace_mcp.servers.retail --transport http --port 8002
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from ._common import STATE_URI, DomainError, EpisodeStore, dump_state, money, request_meta, serve

POLICY = """\
Retail policy (the server does not enforce rules 1 and 2; the agent must):
1. First authenticate the user by email; act only on that user's orders.
2. Items can be returned only within 30 days of delivery; refuse later returns and say so.
3. Pending orders can be cancelled (reason 'no longer needed' or 'ordered by mistake') or have their
   address changed; delivered orders can be returned or exchanged, never cancelled.
4. Exchanges must be for another variant of the same product; refunds go to the original payment
   method or a gift card of the user.
"""

RETURN_WINDOW_DAYS = 30
WRITE_TOOLS = ("cancel_order", "modify_order_address", "return_items", "exchange_items")

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)

# ---------------------------------------------------------------------------- world (pure functions)


def _order(state: dict[str, Any], order_id: str) -> dict[str, Any]:
    order = state["orders"].get(order_id)
    if order is None:
        raise DomainError(f"Unknown order '{order_id}'")
    return order


def _payment(state: dict[str, Any], order: dict[str, Any], payment_method_id: str) -> dict[str, Any]:
    user = state["users"][order["user_id"]]
    method = user["payment_methods"].get(payment_method_id)
    if method is None:
        raise DomainError(f"Payment method '{payment_method_id}' does not belong to user '{user['id']}'")
    if payment_method_id != order["payment_method_id"] and method["type"] != "gift_card":
        raise DomainError("Refunds go to the original payment method or a gift card of the user")
    return method


def _order_view(order: dict[str, Any]) -> dict[str, Any]:
    view = {k: v for k, v in order.items()}
    view["items"] = [dict(i) for i in order["items"]]
    view["total"] = money(sum(i["price"] for i in order["items"]))
    return view


def find_user_by_email(state: dict[str, Any], email: str) -> dict[str, Any]:
    for user in state["users"].values():
        if user["email"].lower() == email.strip().lower():
            return {"user_id": user["id"], "name": user["name"]}
    raise DomainError(f"No user with email '{email}'")


def get_user(state: dict[str, Any], user_id: str) -> dict[str, Any]:
    user = state["users"].get(user_id)
    if user is None:
        raise DomainError(f"Unknown user '{user_id}'")
    return {"id": user["id"], "name": user["name"], "email": user["email"], "address": dict(user["address"]),
            "payment_methods": [dict(m) for m in user["payment_methods"].values()], "order_ids": list(user["order_ids"])}


def list_orders(state: dict[str, Any], user_id: str) -> dict[str, Any]:
    user = state["users"].get(user_id)
    if user is None:
        raise DomainError(f"Unknown user '{user_id}'")
    orders = [_order(state, oid) for oid in user["order_ids"]]
    return {"user_id": user_id, "orders": [
        {"id": o["id"], "status": o["status"], "total": _order_view(o)["total"], "item_count": len(o["items"])}
        for o in orders
    ]}


def get_order(state: dict[str, Any], order_id: str) -> dict[str, Any]:
    return _order_view(_order(state, order_id))


def get_product(state: dict[str, Any], product_id: str) -> dict[str, Any]:
    product = state["products"].get(product_id)
    if product is None:
        raise DomainError(f"Unknown product '{product_id}'")
    return {"id": product["id"], "name": product["name"], "variants": [dict(v) for v in product["variants"].values()]}


def cancel_order(state: dict[str, Any], order_id: str, reason: str) -> dict[str, Any]:
    order = _order(state, order_id)
    if order["status"] != "pending":
        raise DomainError(f"Order '{order_id}' is {order['status']}; only pending orders can be cancelled")
    if reason not in ("no longer needed", "ordered by mistake"):
        raise DomainError("Reason must be 'no longer needed' or 'ordered by mistake'")
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    method = state["users"][order["user_id"]]["payment_methods"][order["payment_method_id"]]
    if method["type"] == "gift_card":
        method["balance"] = money(method["balance"] + _order_view(order)["total"])
    return _order_view(order)


def modify_order_address(state: dict[str, Any], order_id: str, address: dict[str, Any]) -> dict[str, Any]:
    order = _order(state, order_id)
    if order["status"] != "pending":
        raise DomainError(f"Order '{order_id}' is {order['status']}; only pending orders can change address")
    order["address"] = {k: address.get(k, "") for k in ("street", "city", "zip", "country")}
    return _order_view(order)


def _items(order: dict[str, Any], item_ids: list[str]) -> list[dict[str, Any]]:
    if not item_ids:
        raise DomainError("item_ids must not be empty")
    by_id = {i["item_id"]: i for i in order["items"]}
    missing = [i for i in item_ids if i not in by_id]
    if missing:
        raise DomainError(f"Items {missing} are not in order '{order['id']}'")
    if len(set(item_ids)) != len(item_ids):
        raise DomainError("item_ids must not repeat")
    return [by_id[i] for i in item_ids]


def return_items(state: dict[str, Any], order_id: str, item_ids: list[str], payment_method_id: str) -> dict[str, Any]:
    order = _order(state, order_id)
    if order["status"] != "delivered":
        raise DomainError(f"Order '{order_id}' is {order['status']}; only delivered orders can be returned")
    items = _items(order, item_ids)
    method = _payment(state, order, payment_method_id)
    refund = money(sum(i["price"] for i in items))
    order["status"] = "return_requested"
    order["return_request"] = {"item_ids": sorted(item_ids), "payment_method_id": payment_method_id, "refund": refund}
    if method["type"] == "gift_card":
        method["balance"] = money(method["balance"] + refund)
    return _order_view(order)


def exchange_items(
    state: dict[str, Any], order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> dict[str, Any]:
    order = _order(state, order_id)
    if order["status"] != "delivered":
        raise DomainError(f"Order '{order_id}' is {order['status']}; only delivered orders can be exchanged")
    items = _items(order, item_ids)
    if len(new_item_ids) != len(item_ids):
        raise DomainError("new_item_ids must pair one-to-one with item_ids")
    _payment(state, order, payment_method_id)
    difference = 0.0
    for old, new_id in zip(items, new_item_ids):
        product = state["products"][old["product_id"]]
        variant = product["variants"].get(new_id)
        if variant is None:
            raise DomainError(f"Item '{new_id}' is not a variant of product '{product['name']}' ({product['id']})")
        if not variant["available"]:
            raise DomainError(f"Item '{new_id}' is not available")
        if new_id == old["item_id"]:
            raise DomainError(f"Item '{new_id}' is the same as the one being exchanged")
        difference += variant["price"] - old["price"]
    order["status"] = "exchange_requested"
    order["exchange_request"] = {"item_ids": list(item_ids), "new_item_ids": list(new_item_ids),
                         "payment_method_id": payment_method_id, "price_difference": money(difference)}
    return _order_view(order)


OPERATIONS = {f.__name__: f for f in (
    find_user_by_email, get_user, list_orders, get_order, get_product,
    cancel_order, modify_order_address, return_items, exchange_items,
)}


def apply(state: dict[str, Any], tool: str, arguments: dict[str, Any]) -> Any:
    """Run one tool on a state (the checker replays reference actions with this)."""
    return OPERATIONS[tool](state, **arguments)


# ---------------------------------------------------------------------------- MCP surface


class Address(BaseModel):
    street: str = Field(min_length=1)
    city: str = Field(min_length=1)
    zip: str = Field(min_length=3, max_length=10)
    country: str = Field(min_length=2)


class UserRef(BaseModel):
    user_id: str
    name: str


class PaymentMethod(BaseModel):
    id: str
    type: Literal["credit_card", "gift_card", "paypal"]
    balance: float | None = None


class User(BaseModel):
    id: str
    name: str
    email: str
    address: Address
    payment_methods: list[PaymentMethod]
    order_ids: list[str]


class OrderSummary(BaseModel):
    id: str
    status: str
    total: float
    item_count: int


class OrderList(BaseModel):
    user_id: str
    orders: list[OrderSummary]


class Item(BaseModel):
    item_id: str
    product_id: str
    name: str
    options: dict[str, str]
    price: float


class Order(BaseModel):
    id: str
    user_id: str
    status: Literal["pending", "processed", "delivered", "cancelled", "return_requested", "exchange_requested"]
    items: list[Item]
    address: Address
    payment_method_id: str
    delivered_days_ago: int | None
    total: float
    cancel_reason: str | None = None
    return_request: dict[str, Any] | None = None
    exchange_request: dict[str, Any] | None = None


class Variant(BaseModel):
    item_id: str
    options: dict[str, str]
    price: float
    available: bool


class Product(BaseModel):
    id: str
    name: str
    variants: list[Variant]


OrderId = Annotated[str, Field(description="Order id, e.g. '#W1042'", min_length=1)]
ItemIds = Annotated[list[str], Field(min_length=1, description="Item ids from the order")]


def build_server(seed: int = 0, *, tasks: dict[str, Any] | None = None) -> MCPServer:
    """A fresh retail server: its own episode store, worlds from `seed` and the retail task suite."""
    from . import retail_tasks

    suite = tasks if tasks is not None else {t.id: t for t in retail_tasks.generate_suite(seed)}
    world = retail_tasks.default_world(seed)

    def initial_for(task_id: str | None) -> dict[str, Any]:
        if task_id is None:
            return world
        if task_id not in suite:
            raise DomainError(f"Unknown task '{task_id}'")
        return suite[task_id].initial_state

    store = EpisodeStore(initial_for)
    server = MCPServer("retail", instructions=POLICY, version="0.1.0", log_level="WARNING")
    server.episodes = store  # type: ignore[attr-defined]

    def run(ctx: Context, tool: str, **arguments: Any) -> Any:
        try:
            return apply(store.for_request(request_meta(ctx)), tool, arguments)
        except DomainError as exc:
            raise ToolError(str(exc)) from None

    @server.tool(annotations=READ_ONLY)
    def find_user_by_email(email: Annotated[str, Field(min_length=3, description="The user's email")], ctx: Context) -> UserRef:
        """Authenticate a user: find their user id by email."""
        return UserRef(**run(ctx, "find_user_by_email", email=email))

    @server.tool(annotations=READ_ONLY)
    def get_user(user_id: Annotated[str, Field(min_length=1)], ctx: Context) -> User:
        """A user's profile: address, payment methods (with gift card balances) and order ids."""
        return User(**run(ctx, "get_user", user_id=user_id))

    @server.tool(annotations=READ_ONLY)
    def list_orders(user_id: Annotated[str, Field(min_length=1)], ctx: Context) -> OrderList:
        """A user's orders with status and total."""
        return OrderList(**run(ctx, "list_orders", user_id=user_id))

    @server.tool(annotations=READ_ONLY)
    def get_order(order_id: OrderId, ctx: Context) -> Order:
        """Full details of an order: status, items, address, payment method, days since delivery."""
        return Order(**run(ctx, "get_order", order_id=order_id))

    @server.tool(annotations=READ_ONLY)
    def get_product(product_id: Annotated[str, Field(min_length=1)], ctx: Context) -> Product:
        """A product and all its variants (item ids, options, prices, availability)."""
        return Product(**run(ctx, "get_product", product_id=product_id))

    @server.tool(annotations=WRITE)
    def cancel_order(order_id: OrderId, reason: Literal["no longer needed", "ordered by mistake"], ctx: Context) -> Order:
        """Cancel a pending order."""
        return Order(**run(ctx, "cancel_order", order_id=order_id, reason=reason))

    @server.tool(annotations=WRITE)
    def modify_order_address(order_id: OrderId, address: Address, ctx: Context) -> Order:
        """Change the shipping address of a pending order."""
        return Order(**run(ctx, "modify_order_address", order_id=order_id, address=address.model_dump()))

    @server.tool(annotations=WRITE)
    def return_items(
        order_id: OrderId, item_ids: ItemIds, payment_method_id: Annotated[str, Field(min_length=1)], ctx: Context
    ) -> Order:
        """Return items of a delivered order; the refund goes to the given payment method."""
        return Order(**run(ctx, "return_items", order_id=order_id, item_ids=item_ids, payment_method_id=payment_method_id))

    @server.tool(annotations=WRITE)
    def exchange_items(
        order_id: OrderId,
        item_ids: ItemIds,
        new_item_ids: ItemIds,
        payment_method_id: Annotated[str, Field(min_length=1)],
        ctx: Context,
    ) -> Order:
        """Exchange items of a delivered order for other variants of the same products."""
        return Order(**run(ctx, "exchange_items", order_id=order_id, item_ids=item_ids, new_item_ids=new_item_ids,
                           payment_method_id=payment_method_id))

    @server.resource(STATE_URI, mime_type="application/json", description="Full state of one episode (for checkers)")
    def episode_state(episode: str) -> str:
        return dump_state(store.peek(episode))

    return server


def main(argv: list[str] | None = None) -> None:
    serve(build_server, "Retail orders MCP server (envace-mcp)", argv)


if __name__ == "__main__":
    main()
