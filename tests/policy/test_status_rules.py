"""Status rules: failures a world model predicts from facts of the call and the run (an id no reply showed,
a quantity above what an earlier reply said is available, a reservation the run cancelled), learned where
the logged calls with that fact failed in nearly every case, bound to the tool they were learned on, read as
untrusted input, and never turning a predicted failure into a success."""

import json
from types import SimpleNamespace

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from envace_mcp.policy.call_facts import LoggedNumbers
from envace_mcp.policy.status_rules import (
    MIN_RELATION_SUPPORT,
    MIN_SUPPORT,
    RULES_FILE,
    StatusRule,
    StatusTable,
    facts,
    learn,
    read_rules,
    write_rules,
)
from envace_mcp.policy.types import Prediction, RehearseRequest, ToolCall
from envace_mcp.toolbox import ToolSpec

pytestmark = pytest.mark.anyio

SPECS = {name: ToolSpec.from_dict({"name": name, "description": name, "server": "inventory",
                                   "input_schema": {"type": "object"}})
         for name in ("list_items", "get_item", "reserve", "cancel", "ship")}


def run(episode, calls):
    """`calls` ((tool, arguments, reply, failed), in order) as the observed calls of one run, each with the
    conversation before it as a recorded run rebuilds it (`worldmodel.calls.observed_calls`)."""
    history, out = [HumanMessage(content="hold some units")], []
    for i, (tool, arguments, reply, failed) in enumerate(calls):
        request = RehearseRequest(call=ToolCall(id=f"c{i}", name=tool, arguments=arguments), tool=SPECS[tool],
                                  allowed=list(SPECS.values()), history=list(history))
        out.append(SimpleNamespace(tool=tool, failed=failed, value=reply, episode=episode, request=request))
        history += [AIMessage(content="", tool_calls=[{"name": tool, "args": arguments, "id": f"c{i}", "type": "tool_call"}]),
                    ToolMessage(content=reply if isinstance(reply, str) else json.dumps(reply), tool_call_id=f"c{i}",
                                name=tool, status="error" if failed else "success")]
    return out


LISTING = {"items": [{"sku": "KT-1", "available": 3, "discontinued": False, "kind": "mug"},
                     {"sku": "KT-2", "available": 0, "discontinued": True, "kind": "pan"}]}


def test_the_facts_of_a_call_are_read_off_its_arguments_and_the_run():
    calls = run("r", [("list_items", {}, LISTING, False),
                      ("reserve", {"sku": "KT-1", "quantity": 5}, {"id": "R-1", "sku": "KT-1", "status": "reserved"}, False),
                      ("cancel", {"id": "R-1"}, {"id": "R-1", "status": "cancelled"}, False),
                      ("ship", {"id": "R-1"}, "Error: R-1 is cancelled", True),
                      ("ship", {"id": "R-1"}, "", False)])
    reserve, ship_again = calls[1].request, calls[4].request
    assert facts(reserve, known={"KT-1"}) == {"quantity > available", "discontinued = false", 'kind = "mug"'}
    assert facts(ship_again, known=set()) >= {'status = "cancelled"', 'sku = "KT-1"', "after cancel with id",
                                               "after failed ship with id"}
    assert "unseen id" not in facts(ship_again, known=set())  # an earlier reply of the run showed it
    assert "after reserve with id" not in facts(ship_again, known=set())  # the reservation was not called by its id
    typo = run("r", [("list_items", {}, LISTING, False), ("reserve", {"sku": "KT-9", "quantity": 1}, "x", True)])[1].request
    assert "unseen sku" in facts(typo, known=set())  # shown nowhere
    assert "unseen sku" not in facts(typo, known={"KT-9"})  # a logged reply showed it
    assert "unseen sku" not in facts(typo, known=None)  # nothing known: no unseen facts at all
    shown = run("r", [("list_items", {}, LISTING, False), ("reserve", {"sku": "KT-2", "quantity": 1}, "x", True)])[1].request
    assert facts(shown, known=set()) >= {"discontinued = true"} and "unseen sku" not in facts(shown, known=set())


def warehouse(runs=8):
    """A log where a reservation of an SKU no reply showed always fails, one above what an earlier reply said
    is available fails, and the rest succeed."""
    calls = []
    for r in range(runs):
        calls += run(f"run{r}", [("list_items", {}, LISTING, False),
                                 ("reserve", {"sku": f"XX-{r}", "quantity": 1}, "Error: no item", True),
                                 ("reserve", {"sku": "KT-1", "quantity": 9}, "Error: only 3", True),
                                 ("reserve", {"sku": "KT-1", "quantity": 1}, {"id": f"R-{r}", "sku": "KT-1"}, False)])
    return calls


def test_a_fact_that_came_with_a_failure_in_nearly_every_logged_call_becomes_a_rule():
    learned = learn(warehouse())
    rules, known = learned.rules, learned.known
    assert {r.fact: (r.support, r.held) for r in rules["reserve"]} == {"unseen sku": (8, 1.0),
                                                                      "quantity > available": (8, 1.0)}
    # (`quantity > available (run or log)` fires on the very same calls, each run having listed the items: dropped)
    blind = warehouse(5)
    for r in range(3):  # runs that reserve without listing: the items' numbers are known from the other runs
        blind += run(f"blind{r}", [("reserve", {"sku": "KT-1", "quantity": 9}, "Error: only 3", True),
                                   ("reserve", {"sku": "KT-1", "quantity": 1}, {"id": f"B-{r}", "sku": "KT-1"}, False)])
    assert {r.fact: r.support for r in learn(blind).rules["reserve"]} == {"quantity > available (run or log)": 8,
                                                                        "unseen sku": 5}
    # (`quantity > available`, the 5 listed runs' calls, fires only where the run-or-log rule does: dropped)
    assert "KT-1" in known and "XX-0" not in known  # texts of successful replies only
    assert learn(warehouse(MIN_RELATION_SUPPORT - 1)).rules == {}  # too few calls to say
    assert {r.fact for r in learn(warehouse(MIN_RELATION_SUPPORT)).rules["reserve"]} == {"unseen sku",
                                                                                       "quantity > available"}
    calls = warehouse()
    calls[2].failed = False  # one of the eight over-reservations went through: 7 of 8 is under 90 %
    assert [r.fact for r in learn(calls).rules["reserve"]] == ["unseen sku"]


def test_a_rule_on_a_value_needs_more_calls_than_one_on_how_the_call_relates_to_the_run():
    """A log shows one `<field> = <value>` fact per value a field takes, so a few failures with one of them
    can be chance (booking's `organizer = "Eli"`); `unseen`, `>` and `after` facts are a few per tool."""
    def log(tea, over, mug=6):
        calls = []
        for r, (kind, quantity, failed) in enumerate([("tea", 1, True)] * tea + [("mug", 9, True)] * over
                                                      + [("mug", 1, False)] * mug):
            listing = {"items": [{"sku": "KT-1", "available": 3, "kind": kind}]}
            calls += run(f"run{r}", [("list_items", {}, listing, False),
                                     ("reserve", {"sku": "KT-1", "quantity": quantity},
                                      "Error: no" if failed else {"id": f"R-{r}"}, failed)])
        return calls
    assert MIN_RELATION_SUPPORT < MIN_SUPPORT
    ruled = {r.fact for r in learn(log(MIN_SUPPORT - 1, MIN_RELATION_SUPPORT)).rules["reserve"]}
    assert ruled == {"quantity > available"}  # 3 calls relate a quantity to what the run showed: a rule
    ruled = {r.fact for r in learn(log(MIN_SUPPORT, MIN_RELATION_SUPPORT - 1)).rules["reserve"]}
    assert ruled == {'kind = "tea"'}  # 4 calls of a value say nothing, 5 do


def test_an_sku_only_this_run_showed_is_unseen_when_learning_leave_one_run_out():
    """A run that lists an SKU no other run does, then reserves it: while learning the SKU counts as shown by
    this run's earlier reply, not as known from the log; a later reply of the run does not count."""
    calls = []
    for r in range(6):
        own = {"items": [{"sku": f"NEW-{r}", "available": 5}]}
        calls += run(f"run{r}", [("reserve", {"sku": f"NEW-{r}", "quantity": 1}, "Error: no item", True),
                                 ("list_items", {}, own, False),
                                 ("reserve", {"sku": f"NEW-{r}", "quantity": 1}, {"id": "R", "sku": f"NEW-{r}"}, False)])
    learned = learn(calls)
    rules, known = learned.rules, learned.known
    assert [r.fact for r in rules["reserve"]] == ["unseen sku"] and rules["reserve"][0].support == 6
    assert "NEW-0" in known  # at rehearsal time every logged reply counts


def request(arguments, history=(), spec=SPECS["reserve"]):
    return RehearseRequest(call=ToolCall(id="c9", name=spec.name, arguments=arguments), tool=spec, allowed=[spec],
                           history=[HumanMessage(content="hold units"), *history])


def test_a_rehearsal_predicts_the_failure_a_rule_foresees_and_says_which_rule(tmp_path):
    write_rules(tmp_path, learn(warehouse()), {name: (s.server, s.behaviour) for name, s in SPECS.items()})
    table = read_rules(tmp_path)
    assert table.summary() == {"reserve": ["fails when quantity > available (failed in 100% of 8)",
                                           "fails when unseen sku (failed in 100% of 8)"]}
    guess = Prediction(tool="reserve", status="result", result={"id": "R-1"}, p_error=0.02, copied=["sku"], text="{...}")
    typo = table.apply(guess, request({"sku": "KT-7", "quantity": 1}))
    assert (typo.status, typo.ruled, typo.p_error, typo.copied, typo.text) == ("tool_error", "unseen sku", 1.0, [], "{...}")
    assert "unseen sku" in typo.message and typo.result["error_tool_call"]["message"] == typo.message
    assert guess.status == "result"  # a copy: the model's own prediction is not changed in place
    kept = table.apply(guess, request({"sku": "KT-1", "quantity": 1}))  # known, and no state: the model's result,
    assert (kept.status, kept.result, kept.copied, kept.ruled) == ("result", guess.result, ["sku"], None)
    rate = (0 + 0.5) / (8 + 1)  # its P(error) calibrated by the 8 unruled reserves, none failed
    assert kept.p_error == pytest.approx(0.02 + 0.98 * rate) and kept.confidence == pytest.approx(1 - kept.p_error)
    unreadable = Prediction(tool="reserve", status="invalid", code="UNKNOWN")
    assert table.apply(unreadable, request({"sku": "KT-7"})) == unreadable  # a gate fails closed on it: so it stays
    error = Prediction(tool="reserve", status="tool_error", code="EXECUTION_ERROR", message="out of stock", p_error=0.6)
    assert table.apply(error, request({"sku": "KT-7"})).message == "out of stock"  # the model's own words kept
    other = ToolSpec.from_dict({"name": "reserve", "description": "reserve", "server": "elsewhere",
                                "input_schema": {"type": "object"}})
    assert table.apply(guess, request({"sku": "KT-7"}, spec=other)) == guess  # another server's tool: not even calibrated
    changed = ToolSpec.from_dict({"name": "reserve", "description": "reserve", "server": "inventory",
                                  "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}}})
    assert table.apply(guess, request({"sku": "KT-7"}, spec=changed)) == guess  # schemas changed


def test_a_status_rules_file_is_untrusted_input_and_can_only_predict_failures(tmp_path):
    assert read_rules(tmp_path) is None
    path = tmp_path / RULES_FILE
    path.write_text('{"tools": {"reserve": ')
    assert read_rules(tmp_path) is None  # torn
    good = {"fact": "unseen sku", "support": 8, "held": 1.0}
    entry = {"server": "inventory", "behaviour": SPECS["reserve"].behaviour}
    path.write_text(json.dumps({"tools": {
        "reserve": {**entry, "rules": [good, {**good, "held": 0.5}, {**good, "support": 2}, {**good, "support": True},
                                       {**good, "fact": ""}, {**good, "fact": 7}, "unseen sku", None]},
        "unbound": {"server": "inventory", "rules": [good]}, "cancel": [good]},
        "known": ["KT-1", 5, None, {"x": 1}]}))
    table = read_rules(tmp_path)
    assert list(table.tools) == ["reserve"] and [r.fact for r in table.tools["reserve"][1]] == ["unseen sku"]
    assert table.known == {"KT-1"}
    path.write_text(json.dumps({"tools": {"reserve": {**entry, "rules": [good]}}, "pad": "x" * (8 << 20)}))
    assert read_rules(tmp_path) is None  # past the size cap
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert read_rules(tmp_path) is None
    # whatever facts a file names, a rule's only effect is a predicted failure
    hostile = StatusTable({"reserve": ((entry["server"], entry["behaviour"]), [StatusRule("unseen sku", 9, 1.0)])},
                          frozenset({"KT-1"}))
    error = Prediction(tool="reserve", status="tool_error", code="EXECUTION_ERROR", message="no")
    assert hostile.apply(error, request({"sku": "KT-7"})).status == "tool_error"
    assert hostile.apply(error, request({"sku": "KT-1"})) == error


async def test_a_policy_carrying_status_rules_applies_them_to_its_own_rehearsals(tiny_qwen3_dir, bank_catalog):
    """A readable result written through a real tokenizer and parser, for a call whose account no logged
    reply showed: predicted to fail by the rule; a known account's result is left as the model wrote it."""
    from envace_mcp.policy import load_policy
    from envace_mcp.policy.forced import ForcedPolicy

    policy = ForcedPolicy(load_policy(str(tiny_qwen3_dir), rehearse_format="inline"),
                          rehearse=lambda _: '{"account_id": "CHK-1", "type": "checking", "balance": 1.0, "currency": "USD"}')
    spec = next(s for s in bank_catalog if s.name == "get_balance")
    policy.status_rules = StatusTable({"get_balance": ((spec.server, spec.behaviour),
                                                       [StatusRule("unseen account_id", 12, 0.92)])},
                                      frozenset({"CHK-1234"}))

    def call(account):
        return RehearseRequest(call=ToolCall(id="c1", name="get_balance", arguments={"account_id": account}), tool=spec,
                               allowed=list(bank_catalog), history=[HumanMessage(content="What is my balance?")])

    unseen = (await policy.rehearse(call("CHK-0000"))).parsed
    assert (unseen.status, unseen.ruled, unseen.p_error) == ("tool_error", "unseen account_id", 0.92)
    known = (await policy.rehearse(call("CHK-1234"))).parsed
    assert known.status == "result" and known.ruled is None


def test_how_two_arguments_compare_is_a_fact():
    """A range whose end is not after its start: numbers, and texts written alike (times, dates) compare;
    texts of other shapes do not."""
    spec = SPECS["reserve"]

    def of(arguments):
        return facts(RehearseRequest(call=ToolCall(id="c", name="reserve", arguments=arguments), tool=spec), known=None)

    assert of({"start": "10:30", "end": "09:00"}) == {"start > end"}
    assert of({"start": "2026-12-06", "end": "2026-12-06"}) == {"start = end"}
    assert of({"low": 5, "high": 2.5}) == {"low > high"}
    assert of({"start": "10:30", "end": "9:00"}) == set()  # written differently: no order to read
    assert of({"name": "Blue Mug", "title": "Alpha"}) == set()  # words are not ordered quantities


def test_hostile_replies_and_arguments_give_bounded_facts_never_a_crash():
    """From outside: a reply nested 600 deep crashed rehearsal and fit (RecursionError); 2,000 numeric
    arguments made two million facts on every rehearsal."""
    from envace_mcp.policy.call_facts import MAX_ARGUMENTS

    deep = "[" * 5000 + "]" * 5000
    nested: dict = {}
    for _ in range(5000):
        nested = {"a": nested}
    calls = run("r", [("list_items", {}, deep, False), ("reserve", {"sku": "KT-1"}, deep, False),
                      ("reserve", {"sku": "KT-1", "deep": nested}, {"id": "R-1", "seats": 2}, False)])
    assert facts(calls[1].request, known=set()) == {"unseen sku"}  # the deep reply shows nothing
    assert learn(calls * 3).rules == {}
    many = {f"n{i}": i for i in range(2000)}
    assert len(facts(request(many), known=None)) == MAX_ARGUMENTS * (MAX_ARGUMENTS - 1) // 2  # pairs of the first 32


async def test_rules_learned_from_a_real_servers_log_foresee_its_failures_and_nothing_else(tmp_path):
    """The inventory example server in-process, its scripted traffic imported as a user's log would be:
    the rules learned from half the runs predict failures on the other half, and every one they predict
    is a real failure."""
    import sys
    from pathlib import Path

    from envace_mcp.toolbox import Toolbox
    from envace_mcp.traces.importing import read_log
    from envace_mcp.worldmodel import observed_calls

    sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))
    import inventory_traffic
    from inventory_server import build_server

    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in await inventory_traffic.record(160, seed=0)))
    async with Toolbox({"inventory": build_server(0)}) as toolbox:
        traces, _ = read_log(log, toolbox.catalog)
    calls, _ = observed_calls(traces)
    runs = list(dict.fromkeys(c.episode for c in calls))  # in log order: run ids are random, and a split by them
    train = [c for c in calls if c.episode in set(runs[: len(runs) // 2])]  # gave 2 in 30 a chance rule (support 3)
    held = [c for c in calls if c.episode not in set(runs[: len(runs) // 2])]
    learned = learn(train)
    rules, known = learned.rules, learned.known
    assert "unseen sku" in {r.fact for r in rules["reserve"]}
    identities = {c.tool: (c.spec.server, c.spec.behaviour) for c in train}
    table = StatusTable({tool: (identities[tool], found) for tool, found in rules.items()}, frozenset(known))
    said = [c for c in held if table.apply(Prediction(tool=c.tool, status="result"), c.request).ruled]
    assert len(said) >= 5 and all(c.failed for c in said), [(c.tool, c.failed) for c in said]
    from envace_mcp.policy.copying import learn as learn_copies

    from envace_mcp.policy.logged import learn_kinds

    copies = learn_copies(train)
    listed = {r.field: r for r in copies.get("list_items", [])}  # a listing echoes its category
    assert listed["items[].category"].source == "argument" and listed["items[].category"].held >= 0.95
    reserved = {r.field: r for r in copies["reserve"]}  # the price of the item its sku names, as the run read it
    assert (reserved["unit_price"].source, reserved["unit_price"].name) == ("state", "sku")
    shipped = {r.field: r for r in copies["ship"]}  # a shipment's status, whatever the call
    assert (shipped["status"].source, shipped["status"].name) == ("constant", '"shipped"')
    assert all(c.spec.output_schema for c in train) and learn_kinds(train) == {}  # each held to its own schema


def test_a_number_the_log_showed_for_what_a_call_names_is_a_fact_learned_leave_one_run_out(tmp_path):
    """Rooms that outlive a run: one run lists them, later runs book without listing. `attendees > seats
    (run or log)` reads the seats this run showed, else those another run showed; a run learns nothing from
    its own later reply; the rule and the numbers it reads travel in the rules file, and nothing else does."""
    rooms = {"rooms": [{"id": "R-1", "seats": 4, "floor": 2}, {"id": "R-2", "seats": 12, "floor": 3}]}
    specs = {name: ToolSpec.from_dict({"name": name, "description": name, "server": "rooms",
                                       "input_schema": {"type": "object"}}) for name in ("list_rooms", "book")}
    SPECS.update(specs)
    try:
        calls = run("lister", [("list_rooms", {}, rooms, False)])
        for r in range(6):
            calls += run(f"run{r}", [("book", {"room_id": "R-1", "attendees": 6}, "Error: 6 do not fit", True),
                                     ("book", {"room_id": "R-2", "attendees": 6}, {"id": f"B-{r}"}, False)])
        own = run("own", [("book", {"room_id": "R-9", "attendees": 9}, "Error", True),
                          ("list_rooms", {}, {"rooms": [{"id": "R-9", "seats": 2}]}, False)])
        assert "attendees > seats (run or log)" in facts(calls[1].request, logged=LoggedNumbers.of(calls).without("run0"))
        assert "attendees > seats (run or log)" not in facts(own[0].request, logged=LoggedNumbers.of(own).without("own"))
        two = request({"room_id": "R-1", "date": "2026-12-07", "attendees": 6}, spec=specs["book"])
        read = facts(two, known={"R-1", "2026-12-07"}, logged=LoggedNumbers.of(calls).without("run0"))
        assert "unseen date" not in read and "attendees > seats (run or log)" in read  # each argument read alike
        learned = learn(calls + own)
        assert [r.words() for r in learned.rules["book"]] == ["attendees > seats (run or log) (failed in 100% of 6)"]
        assert sorted(map(tuple, learned.logged)) == [("id", "R-1", "seats", 4), ("id", "R-2", "seats", 12),
                                                     ("id", "R-9", "seats", 2)]  # seats only: no rule reads floors
        assert learned.unforeseen["book"] == (1, 7)  # R-9's own failure, which its run showed only after
        write_rules(tmp_path, learned, {name: (s.server, s.behaviour) for name, s in specs.items()})
        table = read_rules(tmp_path)
        blind = request({"room_id": "R-1", "attendees": 5}, spec=specs["book"])  # this run never listed the rooms
        assert table.apply(Prediction(tool="book", status="result", result={}), blind).ruled == "attendees > seats (run or log)"
        fits = request({"room_id": "R-2", "attendees": 5}, spec=specs["book"])
        assert table.apply(Prediction(tool="book", status="result", result={}), fits).status == "result"
    finally:
        for name in specs:
            SPECS.pop(name)


def test_logged_numbers_and_unforeseen_counts_in_a_rules_file_are_untrusted(tmp_path):
    """What is not [key, value, field, finite number], or counts that are not 0 ≤ failed ≤ calls, is dropped;
    counts bound to another tool calibrate nothing; calibration only ever raises P(error)."""
    entry = {"server": "inventory", "behaviour": SPECS["reserve"].behaviour, "rules": []}
    (tmp_path / RULES_FILE).write_text(json.dumps({"tools": {
        "reserve": {**entry, "unforeseen": [1, 3]}, "ship": {**entry, "unforeseen": [5, 2]},
        "cancel": {**entry, "unforeseen": [True, 3]}, "get_item": {**entry, "behaviour": "other", "unforeseen": [3, 3]}},
        "logged": [["id", "R-1", "seats", 4], ["id", "R-2", "seats", float("nan")], ["id", "R-3", "seats", True],
                   ["id", 5, "seats", 1], ["id", "R-4", "seats"], "x"]}).replace("NaN", "NaN"))
    table = read_rules(tmp_path)
    assert table.logged.shown == {("id", "R-1"): {"seats": {"": 4}}}
    assert {t: c for t, (_, c) in table.unforeseen.items()} == {"reserve": (1, 3), "get_item": (3, 3)}
    guess = Prediction(tool="reserve", status="result", result={}, p_error=0.3)
    assert table.apply(guess, request({"sku": "KT-1"})).p_error == pytest.approx(0.3 + 0.7 * 1.5 / 4)
    item = table.apply(Prediction(tool="get_item", status="result", p_error=0.3), request({}, spec=SPECS["get_item"]))
    assert item.p_error == 0.3  # counted on another schema
    for p in (0.0, 0.4, 0.9, 1.0):
        error = Prediction(tool="reserve", status="tool_error", code="EXECUTION_ERROR", p_error=p)
        assert table.apply(error, request({"sku": "KT-1"})).p_error >= p
