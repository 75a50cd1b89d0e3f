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

from envace_mcp.envs.episode import STATE_URI
from envace_mcp.envs.task import DomainError

from ._common import EpisodeStore, dump_state, request_meta, serve
from .retail_domain import POLICY, WRITE_TOOLS, apply  # noqa: F401 - the server module is the domain's face (Suite.server_module)

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)



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
