"""Bank and brokerage MCP server (FinMCP-like): accounts, transfers, quotes, orders, statements.

Stateful and deterministic: the world comes from a seed or from a suite task's initial state, one
copy per episode (see `_common`). Business failures (insufficient funds, unknown account, market
closed) are `isError` results whose text says what went wrong. Some policy rules are *not*
enforced by the server, as in τ²-bench: a careless agent can break them, and the checker sees it.

    python -P -m envace_mcp.servers.bank                       # stdio
    python -P -m envace_mcp.servers.bank --transport http --port 8001
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
from .bank_domain import POLICY, WRITE_TOOLS, apply  # noqa: F401 - the server module is the domain's face (Suite.server_module)

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)



def default_world(seed: int = 0) -> dict[str, Any]:
    """The world served when no task is named: the first training task's initial state."""
    from . import bank_tasks

    return bank_tasks.default_world(seed)


# ---------------------------------------------------------------------------- MCP surface


class Account(BaseModel):
    id: str
    owner: str
    type: Literal["checking", "savings", "brokerage"]
    balance: float
    currency: str = "USD"


class AccountList(BaseModel):
    customer_id: str
    accounts: list[Account]


class Balance(BaseModel):
    account_id: str
    type: str
    balance: float
    currency: str


class Quote(BaseModel):
    symbol: str
    price: float
    market_open: bool


class Position(BaseModel):
    symbol: str
    quantity: int


class Positions(BaseModel):
    account_id: str
    positions: list[Position]


class Order(BaseModel):
    id: str
    account_id: str
    symbol: str
    side: Literal["buy", "sell"]
    quantity: int
    order_type: Literal["market", "limit"]
    limit_price: float | None
    status: Literal["open", "filled", "cancelled"]
    fill_price: float | None


class OrderList(BaseModel):
    account_id: str
    orders: list[Order]


class Transaction(BaseModel):
    id: str
    account_id: str
    type: str
    amount: float
    balance_after: float
    memo: str


class Statement(BaseModel):
    account_id: str
    balance: float
    transactions: list[Transaction]


class TransferReceipt(BaseModel):
    transfer_id: str
    from_account_id: str
    to_account_id: str
    amount: float
    from_balance: float
    to_balance: float


AccountId = Annotated[str, Field(description="Account id, e.g. 'CHK-1042'", min_length=1)]


def build_server(seed: int = 0, *, tasks: dict[str, Any] | None = None) -> MCPServer:
    """A fresh bank server: its own episode store, worlds from `seed` and the bank task suite."""
    from . import bank_tasks

    suite = tasks if tasks is not None else {t.id: t for t in bank_tasks.generate_suite(seed)}
    world = default_world(seed)

    def initial_for(task_id: str | None) -> dict[str, Any]:
        if task_id is None:
            return world
        if task_id not in suite:
            raise DomainError(f"Unknown task '{task_id}'")
        return suite[task_id].initial_state

    store = EpisodeStore(initial_for)
    server = MCPServer("bank", instructions=POLICY, version="0.1.0", log_level="WARNING")
    server.episodes = store  # type: ignore[attr-defined]  # tests and in-process checkers read it

    def run(ctx: Context, tool: str, **arguments: Any) -> Any:
        try:
            return apply(store.for_request(request_meta(ctx)), tool, arguments)
        except DomainError as exc:
            raise ToolError(str(exc)) from None

    @server.tool(annotations=READ_ONLY)
    def list_accounts(customer_id: Annotated[str, Field(description="Customer id, e.g. 'C-1042'")], ctx: Context) -> AccountList:
        """List the accounts owned by a customer with their types and balances."""
        return AccountList(**run(ctx, "list_accounts", customer_id=customer_id))

    @server.tool(annotations=READ_ONLY)
    def get_balance(account_id: AccountId, ctx: Context) -> Balance:
        """Get the current balance of an account."""
        return Balance(**run(ctx, "get_balance", account_id=account_id))

    @server.tool(annotations=READ_ONLY)
    def get_quote(symbol: Annotated[str, Field(description="Ticker symbol, e.g. 'ACME'")], ctx: Context) -> Quote:
        """Get the last price of a stock and whether the market is open."""
        return Quote(**run(ctx, "get_quote", symbol=symbol))

    @server.tool(annotations=READ_ONLY)
    def get_positions(account_id: AccountId, ctx: Context) -> Positions:
        """List the shares held in a brokerage account."""
        return Positions(**run(ctx, "get_positions", account_id=account_id))

    @server.tool(annotations=READ_ONLY)
    def list_orders(
        account_id: AccountId,
        ctx: Context,
        status: Literal["open", "filled", "cancelled", "all"] = "all",
    ) -> OrderList:
        """List the orders of a brokerage account, optionally only those with a given status."""
        return OrderList(**run(ctx, "list_orders", account_id=account_id, status=status))

    @server.tool(annotations=READ_ONLY)
    def get_statement(
        account_id: AccountId,
        ctx: Context,
        limit: Annotated[int, Field(ge=1, le=50, description="How many recent transactions")] = 10,
    ) -> Statement:
        """Recent transactions of an account, newest first, with the current balance."""
        return Statement(**run(ctx, "get_statement", account_id=account_id, limit=limit))

    @server.tool(annotations=WRITE)
    def transfer(
        from_account_id: AccountId,
        to_account_id: AccountId,
        amount: Annotated[float, Field(gt=0, description="Amount in USD")],
        ctx: Context,
        memo: Annotated[str, Field(max_length=140)] = "",
    ) -> TransferReceipt:
        """Move money between two accounts. Fails on insufficient funds or unknown accounts."""
        return TransferReceipt(**run(ctx, "transfer", from_account_id=from_account_id,
                                     to_account_id=to_account_id, amount=amount, memo=memo))

    @server.tool(annotations=WRITE)
    def place_order(
        account_id: AccountId,
        symbol: Annotated[str, Field(min_length=1, max_length=8)],
        side: Literal["buy", "sell"],
        quantity: Annotated[int, Field(ge=1)],
        ctx: Context,
        order_type: Literal["market", "limit"] = "market",
        limit_price: Annotated[float | None, Field(gt=0)] = None,
    ) -> Order:
        """Buy or sell shares in a brokerage account; market orders are rejected while the market is closed."""
        return Order(**run(ctx, "place_order", account_id=account_id, symbol=symbol, side=side,
                           quantity=quantity, order_type=order_type, limit_price=limit_price))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                             open_world_hint=False))
    def cancel_order(order_id: Annotated[str, Field(description="Order id, e.g. 'ORD-17'")], ctx: Context) -> Order:
        """Cancel an open order. Filled or cancelled orders cannot be cancelled."""
        return Order(**run(ctx, "cancel_order", order_id=order_id))

    @server.resource(STATE_URI, mime_type="application/json", description="Full state of one episode (for checkers)")
    def episode_state(episode: str) -> str:
        return dump_state(store.peek(episode))

    return server


def main(argv: list[str] | None = None) -> None:
    serve(build_server, "Bank and brokerage MCP server (envace-mcp)", argv)


if __name__ == "__main__":
    main()
