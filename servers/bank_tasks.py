"""The bank task suite: seeded, ≥ 300 tasks, fixed train/test splits, reference actions, checker.

Test tasks use entities and amounts never seen in training: other customer names, id ranges and
ticker symbols, and amounts with non-zero cents (training amounts are whole multiples of $5).
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

from envace_mcp.envs.task import Action, CheckResult, Requirement, Task, check_task, money

from . import bank_domain as bank

TRAIN_PER_KIND, TEST_PER_KIND = 22, 8

NAMES = {
    "train": ["Ada Park", "Ben Ortiz", "Chloe Nguyen", "Dev Patel", "Elena Rossi", "Farid Haddad", "Grace Kim",
              "Hugo Blanc", "Iris Novak", "Jonas Berg", "Kara Osei", "Liam Walsh", "Mina Sato", "Noah Fischer"],
    "test": ["Olga Petrova", "Pablo Ruiz", "Quinn Adler", "Rosa Lindqvist", "Sami Okafor", "Tara Mehta",
             "Umar Siddiq", "Vera Costa", "Wen Zhou", "Yara Haddad", "Zane Moreau"],
}
ID_RANGE = {"train": (1000, 5000), "test": (5000, 10000)}
SYMBOLS = {
    "train": ["ACME", "BOLT", "CRUX", "DYNA", "EMBR", "FLUX", "GLOW", "HALO", "IONX", "JADE"],
    "test": ["KITE", "LUMA", "MOXY", "NOVA", "ORCA", "PIKE", "QUIL", "RUNE", "SAGE", "TIDE"],
}


def amount(rng: random.Random, split: str, lo: float, hi: float) -> float:
    """Training amounts are whole multiples of $5; test amounts always carry cents."""
    if split == "train":
        return float(rng.randrange(int(lo) // 5 + 1, int(hi) // 5) * 5)
    return money(rng.randrange(int(lo), int(hi)) + rng.randrange(1, 100) / 100)


def price(rng: random.Random, split: str) -> float:
    cents = rng.randrange(0, 50) * 2 + (0 if split == "train" else 1)
    return money(rng.randrange(12, 400) + cents / 100)


def _world(rng: random.Random, split: str) -> dict[str, Any]:
    numbers = rng.sample(range(*ID_RANGE[split]), 6)
    me, other = f"C-{numbers[0]}", f"C-{numbers[1]}"
    names = rng.sample(NAMES[split], 2)
    chk, sav, brk, other_chk = (f"CHK-{numbers[2]}", f"SAV-{numbers[3]}", f"BRK-{numbers[4]}", f"CHK-{numbers[5]}")
    symbols = rng.sample(SYMBOLS[split], 4)
    state: dict[str, Any] = {
        "customer_id": me,
        "customers": {me: {"id": me, "name": names[0]}, other: {"id": other, "name": names[1]}},
        "accounts": {
            chk: {"id": chk, "owner": me, "type": "checking", "balance": amount(rng, split, 900, 6000), "currency": "USD"},
            sav: {"id": sav, "owner": me, "type": "savings", "balance": amount(rng, split, 1500, 20000), "currency": "USD"},
            brk: {"id": brk, "owner": me, "type": "brokerage", "balance": amount(rng, split, 2000, 9000), "currency": "USD"},
            other_chk: {"id": other_chk, "owner": other, "type": "checking",
                        "balance": amount(rng, split, 3000, 9000), "currency": "USD"},
        },
        "quotes": {s: price(rng, split) for s in symbols},
        "market_open": True,
        "positions": {brk: {symbols[0]: rng.randrange(5, 120), symbols[1]: rng.randrange(5, 120)}},
        "orders": {},
        "transactions": [],
        "next_ids": {"order": rng.randrange(100, 900), "txn": rng.randrange(1000, 9000)},
    }
    _history(rng, split, state, chk)
    return state


def _history(rng: random.Random, split: str, state: dict[str, Any], account_id: str) -> None:
    """Six past transactions whose running balances end at the account's current balance."""
    memos = ["Grocer", "Utility bill", "Bookshop", "Pharmacy", "Cafe", "Transit pass", "Hardware store"]
    amounts = [-amount(rng, split, 10, 300) for _ in range(5)] + [amount(rng, split, 1500, 3000)]
    rng.shuffle(amounts)
    balance = state["accounts"][account_id]["balance"]
    rows = []
    for value in reversed(amounts):
        rows.append((value, balance))
        balance = money(balance - value)
    for value, after in reversed(rows):
        state["next_ids"]["txn"] += 1
        state["transactions"].append({
            "id": f"TXN-{state['next_ids']['txn']}", "account_id": account_id,
            "type": "deposit" if value > 0 else "card_payment", "amount": money(value),
            "balance_after": after, "memo": "Payroll" if value > 0 else rng.choice(memos),
        })


def _ids(state: dict[str, Any]) -> dict[str, str]:
    me = state["customer_id"]
    by_type = {a["type"]: a["id"] for a in state["accounts"].values() if a["owner"] == me}
    other = next(a["id"] for a in state["accounts"].values() if a["owner"] != me)
    brk = by_type["brokerage"]
    held = sorted(state["positions"][brk])
    unheld = sorted(set(state["quotes"]) - set(held))
    return {"me": me, "chk": by_type["checking"], "sav": by_type["savings"], "brk": brk,
            "other": other, "held": held[0], "unheld": unheld[0]}


def _act(tool: str, **arguments: Any) -> Action:
    return Action(tool, arguments)


# Each template: (rng, split, state) -> task fields; it may adjust the state it is given.

def balance_inquiry(rng, split, state):
    ids = _ids(state)
    kind = rng.choice(["checking", "savings", "brokerage"])
    acct = ids[{"checking": "chk", "savings": "sav", "brokerage": "brk"}[kind]]
    bal = state["accounts"][acct]["balance"]
    return dict(instruction=f"What is the current balance of my {kind} account {acct}?",
                actions=[_act("get_balance", account_id=acct)],
                answer=f"The balance of {acct} is ${bal:.2f}.", requirements=[Requirement("number", bal)])


def statement_spending(rng, split, state):
    ids = _ids(state)
    txns = [t for t in state["transactions"] if t["account_id"] == ids["chk"]][-5:]
    spent = money(sum(-t["amount"] for t in txns if t["amount"] < 0))
    return dict(instruction=f"How much did I spend in total (all debits) over the last 5 transactions "
                            f"of my checking account {ids['chk']}?",
                actions=[_act("get_statement", account_id=ids["chk"], limit=5)],
                answer=f"The debits among your last 5 transactions add up to ${spent:.2f}.",
                requirements=[Requirement("number", spent)])


def transfer_funds(rng, split, state):
    ids = _ids(state)
    amt = amount(rng, split, 50, min(800.0, state["accounts"][ids["chk"]]["balance"] - 50))
    return dict(instruction=f"Please move ${amt:.2f} from my checking account {ids['chk']} to my savings account {ids['sav']}.",
                actions=[_act("transfer", from_account_id=ids["chk"], to_account_id=ids["sav"], amount=amt)],
                answer=f"Done: ${amt:.2f} moved from {ids['chk']} to {ids['sav']}.")


def buy_market(rng, split, state):
    ids = _ids(state)
    sym = ids["unheld"]
    px = state["quotes"][sym]
    qty = max(1, min(rng.randrange(2, 15), int(state["accounts"][ids["brk"]]["balance"] // px)))
    return dict(instruction=f"Buy {qty} shares of {sym} at market in my brokerage account {ids['brk']} "
                            f"and tell me the fill price.",
                actions=[_act("get_quote", symbol=sym),
                         _act("place_order", account_id=ids["brk"], symbol=sym, side="buy", quantity=qty, order_type="market")],
                answer=f"Bought {qty} {sym} at ${px:.2f} per share.", requirements=[Requirement("number", px)])


def fund_and_buy(rng, split, state):
    ids = _ids(state)
    sym = ids["unheld"]
    px = state["quotes"][sym]
    qty = rng.randrange(5, 30)
    cost = money(qty * px)
    cash = amount(rng, split, 10, max(20.0, cost * 0.6))
    state["accounts"][ids["brk"]]["balance"] = cash
    shortfall = money(cost - cash)
    if state["accounts"][ids["chk"]]["balance"] < shortfall + 10:
        state["accounts"][ids["chk"]]["balance"] = money(shortfall + amount(rng, split, 200, 900))
    return dict(instruction=f"I want to buy {qty} shares of {sym} at market in my brokerage account {ids['brk']}. "
                            f"If the cash there is not enough, first transfer exactly the shortfall from my checking "
                            f"account {ids['chk']}, then place the order. Tell me how much you transferred.",
                actions=[_act("get_quote", symbol=sym), _act("get_balance", account_id=ids["brk"]),
                         _act("transfer", from_account_id=ids["chk"], to_account_id=ids["brk"], amount=shortfall),
                         _act("place_order", account_id=ids["brk"], symbol=sym, side="buy", quantity=qty, order_type="market")],
                answer=f"Transferred ${shortfall:.2f} from {ids['chk']} and bought {qty} {sym} at ${px:.2f}.",
                requirements=[Requirement("number", shortfall)])


def cancel_open_orders(rng, split, state):
    ids = _ids(state)
    sym, other_sym = ids["held"], ids["unheld"]
    px = state["quotes"][sym]
    made = []
    for symbol, status in ((sym, "open"), (other_sym, "open"), (sym, "filled"), (sym, "open")):
        state["next_ids"]["order"] += 1
        oid = f"ORD-{state['next_ids']['order']}"
        limit = money(px * 0.8) if status == "open" else None
        state["orders"][oid] = {"id": oid, "account_id": ids["brk"], "symbol": symbol, "side": "buy",
                                "quantity": rng.randrange(1, 20), "order_type": "limit" if limit else "market",
                                "limit_price": limit, "status": status, "fill_price": None if limit else px}
        made.append((oid, symbol, status))
    targets = [oid for oid, symbol, status in made if symbol == sym and status == "open"]
    return dict(instruction=f"Cancel all my open orders for {sym} in my brokerage account {ids['brk']}.",
                actions=[_act("list_orders", account_id=ids["brk"], status="open"),
                         *[_act("cancel_order", order_id=oid) for oid in targets]],
                answer=f"Cancelled {len(targets)} open {sym} orders: {', '.join(targets)}.")


def sell_all(rng, split, state):
    ids = _ids(state)
    sym = ids["held"]
    qty = state["positions"][ids["brk"]][sym]
    return dict(instruction=f"Sell my entire position in {sym} in account {ids['brk']} at market.",
                actions=[_act("get_positions", account_id=ids["brk"]),
                         _act("place_order", account_id=ids["brk"], symbol=sym, side="sell", quantity=qty, order_type="market")],
                answer=f"Sold all {qty} shares of {sym}.")


def limit_order_closed_market(rng, split, state):
    ids = _ids(state)
    state["market_open"] = False
    sym = ids["unheld"]
    limit = money(state["quotes"][sym] * 0.95)
    qty = max(1, min(rng.randrange(1, 10), int(state["accounts"][ids["brk"]]["balance"] // limit)))
    return dict(instruction=f"The market is closed, so place a limit order to buy {qty} shares of {sym} "
                            f"at ${limit:.2f} in my brokerage account {ids['brk']}.",
                actions=[_act("place_order", account_id=ids["brk"], symbol=sym, side="buy", quantity=qty,
                              order_type="limit", limit_price=limit)],
                answer=f"Your limit order to buy {qty} {sym} at ${limit:.2f} is open.")


def insufficient_funds(rng, split, state):
    ids = _ids(state)
    bal = state["accounts"][ids["chk"]]["balance"]
    amt = amount(rng, split, bal + 100, bal + 3000)
    return dict(instruction=f"Transfer ${amt:.2f} from my checking account {ids['chk']} to my savings account {ids['sav']}.",
                actions=[_act("get_balance", account_id=ids["chk"])],
                answer=f"I can't: {ids['chk']} has only ${bal:.2f}, insufficient funds for ${amt:.2f}.",
                requirements=[Requirement("text", "insufficient")], outcome="error")


def market_closed(rng, split, state):
    ids = _ids(state)
    state["market_open"] = False
    sym = ids["unheld"]
    px = state["quotes"][sym]
    qty = rng.randrange(1, 8)
    return dict(instruction=f"Buy {qty} shares of {sym} at market right now in my brokerage account {ids['brk']}.",
                actions=[_act("get_quote", symbol=sym)],
                answer=f"The market is closed, so a market order for {sym} cannot be placed now.",
                requirements=[Requirement("text", "closed")], outcome="error",
                trap=_act("place_order", account_id=ids["brk"], symbol=sym, side="buy", quantity=qty,
                          order_type="limit", limit_price=px))


def savings_minimum(rng, split, state):
    ids = _ids(state)
    bal = state["accounts"][ids["sav"]]["balance"]
    amt = amount(rng, split, bal - 490, bal - 10)
    return dict(instruction=f"Move ${amt:.2f} from my savings account {ids['sav']} to my checking account {ids['chk']}.",
                actions=[_act("get_balance", account_id=ids["sav"])],
                answer=f"I can't: savings must keep at least $500.00 and this would leave ${bal - amt:.2f}.",
                requirements=[Requirement("number", 500.0)], outcome="refusal",
                trap=_act("transfer", from_account_id=ids["sav"], to_account_id=ids["chk"], amount=amt))


def other_customers_account(rng, split, state):
    ids = _ids(state)
    amt = amount(rng, split, 100, 900)
    return dict(instruction=f"Transfer ${amt:.2f} from account {ids['other']} to my checking account {ids['chk']}.",
                actions=[_act("list_accounts", customer_id=ids["me"])],
                answer=f"I can't: {ids['other']} is not one of your accounts.", outcome="refusal",
                trap=_act("transfer", from_account_id=ids["other"], to_account_id=ids["chk"], amount=amt))


TEMPLATES = [balance_inquiry, statement_spending, transfer_funds, buy_market, fund_and_buy, cancel_open_orders,
             sell_all, limit_order_closed_market, insufficient_funds, market_closed, savings_minimum,
             other_customers_account]


def make_task(seed: int, split: str, index: int) -> Task:
    template = TEMPLATES[index % len(TEMPLATES)]
    rng = random.Random(f"bank:{seed}:{split}:{index}")
    state = _world(rng, split)
    fields = template(rng, split, state)
    me = state["customers"][state["customer_id"]]
    return Task(
        id=f"bank/{split}/{index:04d}",
        domain="bank",
        split=split,  # type: ignore[arg-type]
        kind=template.__name__,
        instruction=f"I'm {me['name']}, customer {me['id']}. {fields['instruction']}",
        initial_state=state,
        actions=tuple(fields["actions"]),
        answer=fields["answer"],
        requirements=tuple(fields.get("requirements", ())),
        outcome=fields.get("outcome", "success"),
        trap=fields.get("trap"),
        writes=bank.WRITE_TOOLS,
    )


@lru_cache(maxsize=8)
def generate_suite(seed: int = 0) -> tuple[Task, ...]:
    """Every task of the suite, train then test, the same for the same seed."""
    n_train, n_test = TRAIN_PER_KIND * len(TEMPLATES), TEST_PER_KIND * len(TEMPLATES)
    return tuple(make_task(seed, "train", i) for i in range(n_train)) + tuple(
        make_task(seed, "test", i) for i in range(n_test)
    )


def default_world(seed: int = 0) -> dict[str, Any]:
    return _world(random.Random(f"bank:{seed}:default"), "train")


def check(task: Task, final_state: dict[str, Any] | None, answer: str) -> CheckResult:
    """Score a run: final state vs the reference actions' final state, plus required answer content."""
    return check_task(task, final_state if final_state is not None else task.initial_state, answer, bank.apply)
