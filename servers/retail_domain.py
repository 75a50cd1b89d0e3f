"""The retail domain as pure functions on a state dict: what the MCP server (`retail.py`) serves, what
the task generator (`retail_tasks.py`) builds tasks and checks runs with, and what replays use."""

from __future__ import annotations

from typing import Any

from envace_mcp.envs.task import DomainError, money


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
