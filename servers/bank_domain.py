"""The bank domain as pure functions on a state dict: what the MCP server (`bank.py`) serves, what
the task generator (`bank_tasks.py`) builds tasks and checks runs with, and what replays use."""

from __future__ import annotations

from typing import Any

from envace_mcp.envs.task import DomainError, money


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
