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

from ._common import STATE_URI, DomainError, EpisodeStore, dump_state, money, request_meta, serve

POLICY = """\
Bank policy (the server does not enforce rules 1 and 2; the agent must):
1. Act only on accounts owned by the customer you are serving (their customer id is given).
2. A savings account must keep at least $500.00 after any transfer out of it; refuse requests that
   would take it lower, and say so.
3. Market orders are only possible while the market is open; do not substitute a limit order
   unless the customer asks for one.
4. Orders can only be placed in brokerage accounts. Amounts are in USD with cents.
"""

SAVINGS_MINIMUM = 500.0
WRITE_TOOLS = ("transfer", "place_order", "cancel_order")

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)

# ---------------------------------------------------------------------------- world (pure functions)


def _account(state: dict[str, Any], account_id: str) -> dict[str, Any]:
    account = state["accounts"].get(account_id)
    if account is None:
        raise DomainError(f"Unknown account '{account_id}'")
    return account


def _next_id(state: dict[str, Any], kind: str, prefix: str) -> str:
    state["next_ids"][kind] += 1
    return f"{prefix}-{state['next_ids'][kind]}"


def _record(state: dict[str, Any], account: dict[str, Any], kind: str, amount: float, memo: str) -> dict[str, Any]:
    account["balance"] = money(account["balance"] + amount)
    txn = {
        "id": _next_id(state, "txn", "TXN"),
        "account_id": account["id"],
        "type": kind,
        "amount": money(amount),
        "balance_after": account["balance"],
        "memo": memo,
    }
    state["transactions"].append(txn)
    return txn


def list_accounts(state: dict[str, Any], customer_id: str) -> dict[str, Any]:
    if customer_id not in state["customers"]:
        raise DomainError(f"Unknown customer '{customer_id}'")
    accounts = [dict(a) for a in state["accounts"].values() if a["owner"] == customer_id]
    return {"customer_id": customer_id, "accounts": accounts}


def get_balance(state: dict[str, Any], account_id: str) -> dict[str, Any]:
    account = _account(state, account_id)
    return {"account_id": account_id, "type": account["type"], "balance": account["balance"], "currency": "USD"}


def get_quote(state: dict[str, Any], symbol: str) -> dict[str, Any]:
    symbol = symbol.upper()
    if symbol not in state["quotes"]:
        raise DomainError(f"Unknown symbol '{symbol}'")
    return {"symbol": symbol, "price": state["quotes"][symbol], "market_open": state["market_open"]}


def get_positions(state: dict[str, Any], account_id: str) -> dict[str, Any]:
    _account(state, account_id)
    held = state["positions"].get(account_id, {})
    return {"account_id": account_id, "positions": [{"symbol": s, "quantity": q} for s, q in sorted(held.items()) if q]}


def list_orders(state: dict[str, Any], account_id: str, status: str = "all") -> dict[str, Any]:
    _account(state, account_id)
    orders = [
        dict(o) for o in state["orders"].values()
        if o["account_id"] == account_id and (status == "all" or o["status"] == status)
    ]
    return {"account_id": account_id, "orders": orders}


def get_statement(state: dict[str, Any], account_id: str, limit: int = 10) -> dict[str, Any]:
    account = _account(state, account_id)
    txns = [dict(t) for t in state["transactions"] if t["account_id"] == account_id][-limit:]
    return {"account_id": account_id, "balance": account["balance"], "transactions": txns[::-1]}


def transfer(state: dict[str, Any], from_account_id: str, to_account_id: str, amount: float, memo: str = "") -> dict[str, Any]:
    source, target = _account(state, from_account_id), _account(state, to_account_id)
    if from_account_id == to_account_id:
        raise DomainError("Cannot transfer an account to itself")
    amount = money(amount)
    if amount <= 0:
        raise DomainError("Transfer amount must be positive")
    if source["balance"] < amount:
        raise DomainError(
            f"Insufficient funds: account '{from_account_id}' has {source['balance']:.2f} USD, transfer needs {amount:.2f}"
        )
    out = _record(state, source, "transfer_out", -amount, memo or f"to {to_account_id}")
    _record(state, target, "transfer_in", amount, memo or f"from {from_account_id}")
    return {"transfer_id": out["id"], "from_account_id": from_account_id, "to_account_id": to_account_id,
            "amount": amount, "from_balance": source["balance"], "to_balance": target["balance"]}


def place_order(
    state: dict[str, Any],
    account_id: str,
    symbol: str,
    side: str,
    quantity: int,
    order_type: str = "market",
    limit_price: float | None = None,
) -> dict[str, Any]:
    account = _account(state, account_id)
    if account["type"] != "brokerage":
        raise DomainError(f"Orders can only be placed in brokerage accounts; '{account_id}' is a {account['type']} account")
    symbol = symbol.upper()
    if symbol not in state["quotes"]:
        raise DomainError(f"Unknown symbol '{symbol}'")
    if quantity < 1:
        raise DomainError("Quantity must be at least 1")
    price = state["quotes"][symbol]
    if order_type == "market" and not state["market_open"]:
        raise DomainError("Market is closed: market orders are rejected until it opens")
    if order_type == "limit" and (limit_price is None or limit_price <= 0):
        raise DomainError("A limit order needs a positive limit_price")
    held = state["positions"].setdefault(account_id, {})
    if side == "sell" and held.get(symbol, 0) < quantity:
        raise DomainError(f"Insufficient shares: {account_id} holds {held.get(symbol, 0)} {symbol}, order sells {quantity}")
    reference_price = price if order_type == "market" else float(limit_price)  # type: ignore[arg-type]
    if side == "buy" and account["balance"] < money(quantity * reference_price):
        raise DomainError(
            f"Insufficient funds: {account_id} has {account['balance']:.2f} USD, order needs {quantity * reference_price:.2f}"
        )
    fills = state["market_open"] and (
        order_type == "market" or (side == "buy" and limit_price >= price) or (side == "sell" and limit_price <= price)
    )
    order = {
        "id": _next_id(state, "order", "ORD"),
        "account_id": account_id,
        "symbol": symbol,
        "side": side,
        "quantity": quantity,
        "order_type": order_type,
        "limit_price": None if order_type == "market" else money(limit_price),  # type: ignore[arg-type]
        "status": "filled" if fills else "open",
        "fill_price": price if fills else None,
    }
    state["orders"][order["id"]] = order
    if fills:
        value = money(quantity * price)
        if side == "buy":
            _record(state, account, "buy", -value, f"{quantity} {symbol} @ {price:.2f}")
            held[symbol] = held.get(symbol, 0) + quantity
        else:
            _record(state, account, "sell", value, f"{quantity} {symbol} @ {price:.2f}")
            held[symbol] -= quantity
    return dict(order)


def cancel_order(state: dict[str, Any], order_id: str) -> dict[str, Any]:
    order = state["orders"].get(order_id)
    if order is None:
        raise DomainError(f"Unknown order '{order_id}'")
    if order["status"] != "open":
        raise DomainError(f"Order '{order_id}' is {order['status']} and cannot be cancelled")
    order["status"] = "cancelled"
    return dict(order)


OPERATIONS = {f.__name__: f for f in (
    list_accounts, get_balance, get_quote, get_positions, list_orders, get_statement, transfer, place_order, cancel_order,
)}


def apply(state: dict[str, Any], tool: str, arguments: dict[str, Any]) -> Any:
    """Run one tool on a state (the checker replays reference actions with this)."""
    return OPERATIONS[tool](state, **arguments)


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
