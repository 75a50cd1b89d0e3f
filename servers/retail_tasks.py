"""The retail task suite: seeded, ≥ 300 tasks, fixed train/test splits, reference actions, checker.

Test tasks use entities and amounts never seen in training: other user names, id ranges and
product names, and prices with odd cents (training prices have even cents).
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

from envace_mcp.envs.task import Action, CheckResult, Requirement, Task, check_task, money

from . import retail_domain as retail

TRAIN_PER_KIND, TEST_PER_KIND = 24, 8

NAMES = {
    "train": ["sara doe", "omar lee", "lena fox", "yusuf ali", "mia chen", "ivan kral", "nora diaz", "tom baker",
              "ana silva", "kofi mensah", "julia weber", "raj kumar"],
    "test": ["emma stone", "diego vega", "hana ito", "luca bianchi", "zoe martin", "amir rahimi", "ines costa",
             "oscar nilsson", "priya shah", "felix braun"],
}
ID_RANGE = {"train": (1000, 5000), "test": (5000, 10000)}
ITEM_RANGE = {"train": (10000, 50000), "test": (50000, 100000)}
ORDER_RANGE = {"train": (1000000, 5000000), "test": (5000000, 10000000)}
PRODUCTS = {
    "train": [("T-Shirt", {"color": ["red", "blue", "black"], "size": ["S", "M", "L"]}),
              ("Running Shoes", {"color": ["white", "grey"], "size": ["8", "9", "10"]}),
              ("Desk Lamp", {"color": ["black", "silver"], "bulb": ["LED", "halogen"]}),
              ("Water Bottle", {"capacity": ["500ml", "750ml", "1L"], "color": ["green", "blue"]}),
              ("Backpack", {"color": ["navy", "olive"], "size": ["20L", "30L"]}),
              ("Headphones", {"color": ["black", "white"], "type": ["wired", "wireless"]})],
    "test": [("Hoodie", {"color": ["maroon", "sand", "teal"], "size": ["S", "M", "L"]}),
             ("Hiking Boots", {"color": ["brown", "black"], "size": ["9", "10", "11"]}),
             ("Office Chair", {"color": ["black", "beige"], "armrests": ["fixed", "adjustable"]}),
             ("Coffee Grinder", {"type": ["manual", "electric"], "color": ["steel", "matte"]}),
             ("Yoga Mat", {"thickness": ["4mm", "6mm"], "color": ["purple", "black"]}),
             ("Smart Watch", {"strap": ["leather", "silicone"], "size": ["40mm", "44mm"]})],
}
STREETS = {"train": ["12 Elm St", "48 Oak Ave", "7 Pine Rd", "230 Maple Dr"],
           "test": ["91 Birch Ln", "5 Cedar Ct", "377 Willow Way", "66 Aspen Pl"]}
CITIES = {"train": [("Springfield", "62704"), ("Riverton", "82501"), ("Lakeside", "92040")],
          "test": [("Fairview", "37062"), ("Georgetown", "78626"), ("Hillsboro", "97123")]}


def price(rng: random.Random, split: str, lo: int = 15, hi: int = 300) -> float:
    cents = rng.randrange(0, 50) * 2 + (0 if split == "train" else 1)
    return money(rng.randrange(lo, hi) + cents / 100)


def _address(rng: random.Random, split: str) -> dict[str, str]:
    city, zip_code = rng.choice(CITIES[split])
    return {"street": rng.choice(STREETS[split]), "city": city, "zip": zip_code, "country": "USA"}


def _products(rng: random.Random, split: str) -> dict[str, Any]:
    products = {}
    product_ids = iter(rng.sample(range(*ID_RANGE[split]), 4))
    item_ids = iter(rng.sample(range(*ITEM_RANGE[split]), 64))
    for name, options in rng.sample(PRODUCTS[split], 4):
        pid = f"P-{next(product_ids)}"
        base = price(rng, split)
        keys = list(options)
        variants = {}
        for a in options[keys[0]]:
            for b in options[keys[1]]:
                iid = f"I-{next(item_ids)}"
                variants[iid] = {"item_id": iid, "options": {keys[0]: a, keys[1]: b},
                                 "price": money(base + rng.randrange(0, 4) * 5), "available": rng.random() < 0.75}
        products[pid] = {"id": pid, "name": name, "variants": variants}
    return products


def _user(rng: random.Random, split: str, name: str, number: int) -> dict[str, Any]:
    first, last = name.split()
    uid = f"{first}_{last}_{number}"
    return {"id": uid, "name": name.title(), "email": f"{first}.{last}{number}@example.com",
            "address": _address(rng, split),
            "payment_methods": {
                f"credit_card_{number}": {"id": f"credit_card_{number}", "type": "credit_card", "balance": None},
                f"gift_card_{number}": {"id": f"gift_card_{number}", "type": "gift_card",
                                        "balance": price(rng, split, 10, 150)},
            },
            "order_ids": []}


def _make_order(rng, split, state, user, status, days, products) -> dict[str, Any]:
    oid = f"#W{rng.randrange(*ORDER_RANGE[split])}"
    while oid in state["orders"]:
        oid = f"#W{rng.randrange(*ORDER_RANGE[split])}"
    items = []
    for pid in rng.sample(sorted(products), rng.randrange(1, 3)):
        variant = state["products"][pid]["variants"][rng.choice(sorted(state["products"][pid]["variants"]))]
        items.append({"item_id": variant["item_id"], "product_id": pid, "name": state["products"][pid]["name"],
                      "options": dict(variant["options"]), "price": variant["price"]})
    method = rng.choice(sorted(user["payment_methods"]))
    order = {"id": oid, "user_id": user["id"], "status": status, "items": items, "address": dict(user["address"]),
             "payment_method_id": method, "delivered_days_ago": days, "cancel_reason": None,
             "return_request": None, "exchange_request": None}
    state["orders"][oid] = order
    user["order_ids"].append(oid)
    return order


def _world(rng: random.Random, split: str) -> dict[str, Any]:
    n_me, n_other = rng.sample(range(*ID_RANGE[split]), 2)
    name_me, name_other = rng.sample(NAMES[split], 2)
    state: dict[str, Any] = {"products": _products(rng, split), "users": {}, "orders": {}}
    me, other = _user(rng, split, name_me, n_me), _user(rng, split, name_other, n_other)
    state["users"] = {me["id"]: me, other["id"]: other}
    state["user_id"] = me["id"]
    products = state["products"]
    _make_order(rng, split, state, me, "pending", None, products)
    _make_order(rng, split, state, me, "delivered", rng.randrange(2, 25), products)
    _make_order(rng, split, state, me, "delivered", rng.randrange(40, 120), products)
    _make_order(rng, split, state, me, "processed", None, products)
    _make_order(rng, split, state, other, "pending", None, products)
    return state


def _ctx(state: dict[str, Any]) -> dict[str, Any]:
    me = state["users"][state["user_id"]]
    orders = [state["orders"][o] for o in me["order_ids"]]
    other = next(u for u in state["users"].values() if u["id"] != me["id"])
    return {"me": me, "email": me["email"],
            "pending": next(o for o in orders if o["status"] == "pending"),
            "recent": next(o for o in orders if o["status"] == "delivered" and o["delivered_days_ago"] <= 30),
            "old": next(o for o in orders if o["status"] == "delivered" and o["delivered_days_ago"] > 30),
            "processed": next(o for o in orders if o["status"] == "processed"),
            "other_order": state["orders"][other["order_ids"][0]]}


def _act(tool: str, **arguments: Any) -> Action:
    return Action(tool, arguments)


def _auth(c: dict[str, Any]) -> Action:
    return _act("find_user_by_email", email=c["email"])


def _options(item: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in item["options"].items())


def order_status(rng, split, state):
    c = _ctx(state)
    order = rng.choice([c["pending"], c["processed"], c["recent"]])
    return dict(instruction=f"What is the status of my order {order['id']}?",
                actions=[_auth(c), _act("get_order", order_id=order["id"])],
                answer=f"Order {order['id']} is {order['status']}.", requirements=[Requirement("text", order["status"])])


def cancel_pending(rng, split, state):
    c = _ctx(state)
    oid = c["pending"]["id"]
    reason = rng.choice(["ordered by mistake", "no longer needed"])
    said = "I ordered it by mistake" if reason == "ordered by mistake" else "I no longer need it"
    return dict(instruction=f"Please cancel my order {oid}, {said}.",
                actions=[_auth(c), _act("get_order", order_id=oid), _act("cancel_order", order_id=oid, reason=reason)],
                answer=f"Order {oid} is cancelled.")


def change_address(rng, split, state):
    c = _ctx(state)
    oid = c["pending"]["id"]
    new = _address(rng, split)
    while new == c["pending"]["address"]:
        new = _address(rng, split)
    where = f"{new['street']}, {new['city']} {new['zip']}, {new['country']}"
    return dict(instruction=f"Please ship my pending order {oid} to {where} instead.",
                actions=[_auth(c), _act("get_order", order_id=oid),
                         _act("modify_order_address", order_id=oid, address=new)],
                answer=f"Order {oid} will now ship to {where}.")


def return_to_gift_card(rng, split, state):
    c = _ctx(state)
    order = c["recent"]
    item = rng.choice(order["items"])
    gift = next(m for m in c["me"]["payment_methods"].values() if m["type"] == "gift_card")
    return dict(instruction=f"I'd like to return the {item['name']} from order {order['id']}; "
                            f"please refund it to my gift card.",
                actions=[_auth(c), _act("get_order", order_id=order["id"]), _act("get_user", user_id=c["me"]["id"]),
                         _act("return_items", order_id=order["id"], item_ids=[item["item_id"]], payment_method_id=gift["id"])],
                answer=f"Return requested; ${item['price']:.2f} goes to your gift card.",
                requirements=[Requirement("number", item["price"])])


def exchange_variant(rng, split, state):
    c = _ctx(state)
    order = c["recent"]
    item = rng.choice(order["items"])
    variants = state["products"][item["product_id"]]["variants"]
    choices = [v for v in variants.values() if v["available"] and v["item_id"] != item["item_id"]]
    if not choices:
        pick = next(v for v in variants.values() if v["item_id"] != item["item_id"])
        pick["available"] = True
        choices = [pick]
    new = rng.choice(choices)
    return dict(instruction=f"Please exchange the {item['name']} ({_options(item)}) from order {order['id']} for the "
                            f"{_options(new)} version, using the order's original payment method.",
                actions=[_auth(c), _act("get_order", order_id=order["id"]),
                         _act("get_product", product_id=item["product_id"]),
                         _act("exchange_items", order_id=order["id"], item_ids=[item["item_id"]],
                              new_item_ids=[new["item_id"]], payment_method_id=order["payment_method_id"])],
                answer=f"Exchange requested: {item['name']} now {_options(new)}.")


def cancel_delivered(rng, split, state):
    c = _ctx(state)
    oid = c["recent"]["id"]
    return dict(instruction=f"Cancel my order {oid}, I no longer need it.",
                actions=[_auth(c), _act("get_order", order_id=oid)],
                answer=f"Order {oid} was already delivered, so it cannot be cancelled; you can return it instead.",
                requirements=[Requirement("text", "delivered")], outcome="error")


def late_return(rng, split, state):
    c = _ctx(state)
    order = c["old"]
    return dict(instruction=f"I want to return everything in order {order['id']} to my original payment method.",
                actions=[_auth(c), _act("get_order", order_id=order["id"])],
                answer=f"Order {order['id']} was delivered {order['delivered_days_ago']} days ago, past the 30-day "
                       f"return window, so it cannot be returned.",
                requirements=[Requirement("number", 30)], outcome="refusal",
                trap=_act("return_items", order_id=order["id"], item_ids=[i["item_id"] for i in order["items"]],
                          payment_method_id=order["payment_method_id"]))


def other_users_order(rng, split, state):
    c = _ctx(state)
    oid = c["other_order"]["id"]
    return dict(instruction=f"Cancel order {oid}, I no longer need it.",
                actions=[_auth(c), _act("get_user", user_id=c["me"]["id"])],
                answer=f"Order {oid} is not one of your orders, so I can't cancel it.", outcome="refusal",
                trap=_act("cancel_order", order_id=oid, reason="no longer needed"))


def delivered_total(rng, split, state):
    c = _ctx(state)
    delivered = [state["orders"][o] for o in c["me"]["order_ids"] if state["orders"][o]["status"] == "delivered"]
    total = money(sum(i["price"] for o in delivered for i in o["items"]))
    return dict(instruction="How much did I pay in total for my delivered orders?",
                actions=[_auth(c), _act("list_orders", user_id=c["me"]["id"])],
                answer=f"Your delivered orders total ${total:.2f}.", requirements=[Requirement("number", total)])


def cancel_and_return(rng, split, state):
    c = _ctx(state)
    pending, order = c["pending"], c["recent"]
    item = rng.choice(order["items"])
    gift = next(m for m in c["me"]["payment_methods"].values() if m["type"] == "gift_card")
    return dict(instruction=f"Two things: cancel my pending order {pending['id']} since I no longer need it, and return "
                            f"the {item['name']} from order {order['id']} with the refund on my gift card.",
                actions=[_auth(c), _act("get_order", order_id=pending["id"]),
                         _act("cancel_order", order_id=pending["id"], reason="no longer needed"),
                         _act("get_order", order_id=order["id"]), _act("get_user", user_id=c["me"]["id"]),
                         _act("return_items", order_id=order["id"], item_ids=[item["item_id"]], payment_method_id=gift["id"])],
                answer=f"Cancelled {pending['id']} and requested the return of the {item['name']}.")


TEMPLATES = [order_status, cancel_pending, change_address, return_to_gift_card, exchange_variant, cancel_delivered,
             late_return, other_users_order, delivered_total, cancel_and_return]


def make_task(seed: int, split: str, index: int) -> Task:
    template = TEMPLATES[index % len(TEMPLATES)]
    rng = random.Random(f"retail:{seed}:{split}:{index}")
    state = _world(rng, split)
    fields = template(rng, split, state)
    me = state["users"][state["user_id"]]
    return Task(
        id=f"retail/{split}/{index:04d}",
        domain="retail",
        split=split,  # type: ignore[arg-type]
        kind=template.__name__,
        instruction=f"Hi, this is {me['name']} ({me['email']}). {fields['instruction']}",
        initial_state=state,
        actions=tuple(fields["actions"]),
        answer=fields["answer"],
        requirements=tuple(fields.get("requirements", ())),
        outcome=fields.get("outcome", "success"),
        trap=fields.get("trap"),
        writes=retail.WRITE_TOOLS,
    )


@lru_cache(maxsize=8)
def generate_suite(seed: int = 0) -> tuple[Task, ...]:
    """Every task of the suite, train then test, the same for the same seed."""
    n_train, n_test = TRAIN_PER_KIND * len(TEMPLATES), TEST_PER_KIND * len(TEMPLATES)
    return tuple(make_task(seed, "train", i) for i in range(n_train)) + tuple(
        make_task(seed, "test", i) for i in range(n_test)
    )


def default_world(seed: int = 0) -> dict[str, Any]:
    return _world(random.Random(f"retail:{seed}:default"), "train")


def check(task: Task, final_state: dict[str, Any] | None, answer: str) -> CheckResult:
    """Score a run: final state vs the reference actions' final state, plus required answer content."""
    return check_task(task, final_state if final_state is not None else task.initial_state, answer, retail.apply)
