"""Copy rules: reply fields a world model takes from the call or the run, learned where the logged replies
show them so in nearly every call, bound to the tool they were learned on, read as untrusted input."""

import json
from types import SimpleNamespace

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from envace_mcp.policy.copying import MAX_BYTES, MIN_SUPPORT, RULES_FILE, learn, read_rules, write_rules
from envace_mcp.policy.logged import MAX_MADE, learn_lookups, learn_replies, learn_stable
from envace_mcp.policy.types import Prediction, RehearseRequest, ToolCall
from envace_mcp.toolbox import ToolSpec

pytestmark = pytest.mark.anyio

SPEC = ToolSpec.from_dict({"name": "reserve", "description": "hold units", "server": "inventory",
                           "input_schema": {"type": "object"}})


def observed(tool, arguments, value, earlier=(), failed=False, history=()):
    return SimpleNamespace(tool=tool, failed=failed, value=value, earlier=list(earlier),
                           spec=SimpleNamespace(output_schema=None),
                           request=SimpleNamespace(call=SimpleNamespace(arguments=arguments), history=list(history)))


def reservations(n, *, wrong=0):
    calls = []
    for i in range(n):
        sku, qty = f"OFF-{200 + i}", 1 + i % 3
        reply = {"id": f"RSV-{1000 + i}", "sku": sku if i >= wrong else "OFF-999", "quantity": qty,
                 "item_name": f"Tray {i}", "total": 9.5 * qty + i, "status": "reserved"}
        calls.append(observed("reserve", {"sku": sku, "quantity": qty, "customer": "Hana"}, reply,
                              earlier=[{"sku": sku, "name": "x", "item_name": f"Tray {i}"}]))
    return calls


def test_a_field_that_equals_an_argument_or_an_earlier_value_in_nearly_every_reply_becomes_a_rule():
    rules = {r.field: r for r in learn(reservations(20, wrong=1))["reserve"]}  # 19 of 20: 95 %
    assert (rules["sku"].source, rules["sku"].name, rules["sku"].support, rules["sku"].held) == ("argument", "sku", 20, 0.95)
    assert (rules["quantity"].source, rules["quantity"].name) == ("argument", "quantity")
    assert (rules["item_name"].source, rules["item_name"].name) == ("earlier", "item_name")
    assert {"id", "total"}.isdisjoint(rules)  # made by the server, a new value each call
    assert (rules["status"].source, rules["status"].name, rules["status"].held) == ("constant", '"reserved"', 1.0)
    assert "sku" not in {r.field for r in learn(reservations(20, wrong=2)).get("reserve", [])}  # 90 %: no rule
    assert learn(reservations(MIN_SUPPORT - 1)) == {}  # too few replies to say
    failing = [observed("reserve", {"sku": "A"}, "no such item", failed=True)] * 10
    assert learn(failing) == {}  # learned from successful replies only


def test_a_field_of_every_listed_element_is_one_field_and_a_rule_sets_it_in_each_predicted_element(tmp_path):
    """A listing echoes the category it was asked for in every item (inventory's `list_items`): one rule,
    `items[].category`, counted per element, set in each item the model predicted, nowhere else."""
    listings = [observed("list_items", {"category": c}, {"category": c, "items": [
        {"sku": f"{c}-{i}", "category": c, "tags": ["a", "b"]} for i in range(3)]}) for c in ("mugs", "pans")]
    rules = {r.field: r for r in learn(listings)["list_items"]}
    assert (rules["items[].category"].source, rules["items[].category"].support) == ("argument", 6)
    assert "items[].sku" not in rules and not any("tags" in f for f in rules)  # each its own; a list of plain values
    spec = ToolSpec.from_dict({"name": "list_items", "description": "list", "server": "inventory",
                               "input_schema": {"type": "object"}})
    write_rules(tmp_path, learn(listings), {"list_items": (spec.server, spec.behaviour)})
    guess = Prediction(tool="list_items", status="result", text="{...}", result={
        "category": "mug", "items": [{"sku": "M-1", "category": "mug"}, {"sku": "M-2"}, "odd"]})
    got = read_rules(tmp_path).apply(guess, request({"category": "mugs"}, spec=spec))
    assert got.result == {"category": "mug", "items": [{"sku": "M-1", "category": "mugs"},  # (2 listings: no rule
                                                        {"sku": "M-2", "category": "mugs"}, "odd"]}  # for the top level)
    assert got.copied == ["items[].category"]
    flat = Prediction(tool="list_items", status="result", result={"category": "mug", "items": "none"})
    assert read_rules(tmp_path).apply(flat, request({"category": "mugs"}, spec=spec)) == flat  # no list predicted


def test_a_reply_that_is_itself_a_list_gets_its_rules_and_its_logged_reply(tmp_path):
    """τ²-airline's `search_direct_flight` replies with a bare list of flights, each echoing the origin and
    destination asked: one rule `[].origin`, set in every flight predicted; a catalog replied as a bare list
    is a logged reply like any other."""
    flights = [observed("search", {"origin": o, "destination": "MCO"}, [
        {"flight": f"HAT{i}", "origin": o, "destination": "MCO", "seats": i} for i in range(3)]) for o in ("JFK", "BOS")]
    rules = {r.field: r for r in learn(flights)["search"]}
    assert (rules["[].origin"].source, rules["[].origin"].name, rules["[].origin"].support) == ("argument", "origin", 6)
    assert rules["[].destination"].name == "destination" and "[].flight" not in rules and "[].seats" not in rules
    spec = ToolSpec.from_dict({"name": "search", "description": "flights", "server": "airline",
                               "input_schema": {"type": "object"}})
    write_rules(tmp_path, learn(flights), {"search": (spec.server, spec.behaviour)})
    guess = Prediction(tool="search", status="result", result=[{"flight": "HAT9", "origin": "LAX"}, {"flight": "HAT8"}, 7])
    got = read_rules(tmp_path).apply(guess, request({"origin": "JFK", "destination": "MCO"}, spec=spec))
    assert got.result == [{"flight": "HAT9", "origin": "JFK", "destination": "MCO"},
                          {"flight": "HAT8", "origin": "JFK", "destination": "MCO"}, 7]
    assert got.copied == ["[].destination", "[].origin"] and guess.result[0]["origin"] == "LAX"
    assert read_rules(tmp_path).apply(guess.model_copy(update={"result": {"flights": []}}),
                                      request({"origin": "JFK"}, spec=spec)).copied == []  # no list predicted
    repeats = [observed("search", {"origin": "JFK"}, [{"flight": "HAT1"}, {"flight": "HAT2"}])] * 6
    write_rules(tmp_path, {}, {"search": (spec.server, spec.behaviour)}, learn_stable(repeats))
    logged = read_rules(tmp_path).apply(guess, request({"origin": "JFK"}, spec=spec))
    assert logged.result == [{"flight": "HAT1"}, {"flight": "HAT2"}] and logged.copied == ["[]"]


def request(arguments, history=(), spec=SPEC):
    return RehearseRequest(call=ToolCall(id="c1", name="reserve", arguments=arguments), tool=spec, allowed=[spec],
                           history=list(history))


def test_a_rehearsal_takes_ruled_fields_from_the_call_and_the_run_and_says_which(tmp_path):
    write_rules(tmp_path, learn(reservations(20)), {"reserve": (SPEC.server, SPEC.behaviour)})
    table = read_rules(tmp_path)
    history = [HumanMessage(content="hold 2 trays"), AIMessage(content=""),  # a reply as content blocks, too
               ToolMessage(content=[{"type": "text", "text": json.dumps({"sku": "OFF-7", "item_name": "Paper Tray"})}],
                           tool_call_id="c0")]
    guess = Prediction(tool="reserve", status="result", text="{...}",
                       result={"id": "RSV-1", "sku": "OFF-1", "quantity": 9, "item_name": "Desk", "total": 19.0})
    got = table.apply(guess, request({"sku": "OFF-7", "quantity": 2, "customer": "Hana"}, history))
    assert got.result == {"id": "RSV-1", "sku": "OFF-7", "quantity": 2, "item_name": "Paper Tray", "total": 19.0,
                          "status": "reserved"}  # the status every logged reservation had
    assert sorted(got.copied) == ["item_name", "quantity", "sku", "status"] and got.text == "{...}"  # what it wrote is kept
    assert guess.result["sku"] == "OFF-1"  # a copy: the model's own prediction is not changed in place
    cut = Prediction(tool="reserve", status="result", code="CUT", partial=True, result=None, text='{"id": "RS')
    filled = table.apply(cut, request({"sku": "OFF-7", "quantity": 2, "customer": "Hana"}, history))
    assert filled.result == {"sku": "OFF-7", "quantity": 2, "item_name": "Paper Tray", "status": "reserved"}
    assert filled.partial  # cut, as known
    assert table.apply(cut, request({"customer": "Hana"})).result == {"status": "reserved"}  # what holds whatever the call
    assert table.apply(cut.model_copy(update={"partial": False}), request({"sku": "OFF-7"})).result is None
    no_source = table.apply(guess, request({"quantity": 2}))  # no sku given, nothing read earlier
    assert no_source.result["sku"] == "OFF-1" and no_source.copied == ["quantity", "status"]
    error = Prediction(tool="reserve", status="tool_error", code="EXECUTION_ERROR", message="out of stock")
    assert table.apply(error, request({"sku": "OFF-7", "quantity": 2})) == error
    other = ToolSpec.from_dict({"name": "reserve", "description": "hold units", "server": "elsewhere",
                                "input_schema": {"type": "object"}})
    assert table.apply(guess, request({"sku": "OFF-7", "quantity": 2}, spec=other)) == guess  # another server's tool
    changed = ToolSpec.from_dict({"name": "reserve", "description": "hold units", "server": "inventory",
                                  "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}}})
    assert table.apply(guess, request({"sku": "OFF-7", "quantity": 2}, spec=changed)) == guess  # schemas changed


ROOMS = ToolSpec.from_dict({"name": "list_rooms", "description": "the rooms", "server": "booking",
                             "input_schema": {"type": "object"}})


def catalog(n, *, changed=0):
    """`n` listings of rooms, asked with one of two filters; the first `changed` repeats got another reply."""
    calls = []
    for i in range(n):
        floor = i % 2 + 1
        rooms = [{"id": f"R-{floor}0{k}", "seats": 4 + k, "floor": floor} for k in range(3)]
        if 2 <= i < 2 + changed:
            rooms = rooms[:1]
        calls.append(observed("list_rooms", {"floor": floor}, {"rooms": rooms}))
    return calls


def test_a_tool_that_gave_the_same_reply_to_the_same_arguments_is_predicted_as_its_logged_reply(tmp_path):
    stable = learn_stable(catalog(12))
    assert list(stable) == ["list_rooms"] and (stable["list_rooms"].support, stable["list_rooms"].held) == (10, 1.0)
    assert learn_stable(catalog(MIN_SUPPORT)) == {}  # 3 repeats: too few to say
    assert learn_stable(catalog(12, changed=1)) == {}  # 9 of 10 repeats: under 95 %
    assert learn_stable(reservations(20)) == {}  # no arguments asked twice
    write_rules(tmp_path, {}, {"list_rooms": (ROOMS.server, ROOMS.behaviour)}, stable)
    table = read_rules(tmp_path)
    assert table.summary()["list_rooms"][0].startswith("the whole reply = the logged reply to the same arguments")
    guess = Prediction(tool="list_rooms", status="result", text="{...}", result={"rooms": [{"id": "R-101", "seats": 9}]})
    got = table.apply(guess, request({"floor": 1}, spec=ROOMS))
    assert got.result == catalog(1)[0].value and got.copied == ["rooms"] and got.text == "{...}"
    assert table.apply(guess, request({"floor": 3}, spec=ROOMS)) == guess  # never asked: the model's own
    error = Prediction(tool="list_rooms", status="tool_error", code="EXECUTION_ERROR", message="down")
    assert table.apply(error, request({"floor": 1}, spec=ROOMS)) == error  # never turns a failure into a reply
    moved = ToolSpec.from_dict({"name": "list_rooms", "description": "the rooms", "server": "other",
                                "input_schema": {"type": "object"}})
    assert table.apply(guess, request({"floor": 1}, spec=moved)) == guess  # another server's tool
    got.result["rooms"].clear()
    assert table.apply(guess, request({"floor": 1}, spec=ROOMS)).result["rooms"]  # each prediction its own copy


def test_a_rules_file_is_untrusted_input(tmp_path):
    assert read_rules(tmp_path) is None
    path = tmp_path / RULES_FILE
    path.write_text('{"tools": {"reserve": ')
    assert read_rules(tmp_path) is None  # torn
    good = {"field": "sku", "source": "argument", "name": "sku", "support": 20, "held": 1.0}
    entry = {"server": "inventory", "behaviour": SPEC.behaviour}
    path.write_text(json.dumps({"tools": {
        "reserve": {**entry, "rules": [good, {**good, "held": 0.5}, {**good, "support": 2}, {**good, "source": "shell"},
                                       {**good, "field": "items[0].sku"}, {**good, "field": "tags[]"},
                                       {**good, "support": True}, {**good, "source": "constant", "name": "not json"},
                                       {**good, "source": "constant", "name": '{"rm": "-rf"}'},
                                       {**good, "source": "constant", "name": json.dumps("x" * 60)}, "sku", None]},
        "unbound": {"server": "inventory", "rules": [good]},
        "cancel": [good]}}))
    table = read_rules(tmp_path)
    assert list(table.tools) == ["reserve"] and [r.field for r in table.tools["reserve"][1]] == ["sku"]
    path.write_text(json.dumps({"tools": {"reserve": {**entry, "rules": [good]}}, "pad": "x" * (1 << 20)}))
    assert read_rules(tmp_path) is None  # past the size cap
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(deep)
    assert read_rules(tmp_path) is None
    replies = [[{"floor": 1}, {"rooms": []}], [{"floor": 2}, "text"], ["floor", {}], [{"floor": 3}], None]
    stable = {"support": 10, "held": 1.0, "replies": replies}
    path.write_text(json.dumps({"tools": {
        "list_rooms": {"server": "booking", "behaviour": ROOMS.behaviour, "rules": [], "stable": stable},
        "weak": {"server": "booking", "behaviour": "x", "rules": [], "stable": {**stable, "held": 0.5}},
        "few": {"server": "booking", "behaviour": "x", "rules": [], "stable": {**stable, "support": 2}},
        "unbound": {"server": "booking", "rules": [], "stable": stable}}}))
    table = read_rules(tmp_path)
    assert list(table.stable) == ["list_rooms"] and table.stable["list_rooms"][1].replies == {'{"floor": 1}': {"rooms": []}}


async def test_a_policy_carrying_rules_applies_them_to_its_own_rehearsals(tiny_qwen3_dir, bank_catalog):
    """A rehearsal written through a real tokenizer and parsed as any is (forced, so the reply is a readable
    one): the ruled field is set to the call's, the others are as written, and an error is left alone."""
    from envace_mcp.policy import load_policy
    from envace_mcp.policy.copying import CopyRule, RuleTable
    from envace_mcp.policy.forced import ForcedPolicy

    replies = iter(['{"account_id": "SAV-9", "type": "checking", "balance": 10.5, "currency": "USD"}',
                    "Error: unknown account"])
    policy = ForcedPolicy(load_policy(str(tiny_qwen3_dir), rehearse_format="inline"), rehearse=lambda _: next(replies))
    spec = next(s for s in bank_catalog if s.name == "get_balance")
    policy.copy_rules = RuleTable({"get_balance": ((spec.server, spec.behaviour),
                                                   [CopyRule("account_id", "argument", "account_id", 20, 1.0)])})
    call = RehearseRequest(call=ToolCall(id="c1", name="get_balance", arguments={"account_id": "CHK-1234"}), tool=spec,
                           allowed=list(bank_catalog), history=[HumanMessage(content="What is my balance?")])
    result = (await policy.rehearse(call)).parsed
    assert result.result == {"account_id": "CHK-1234", "type": "checking", "balance": 10.5, "currency": "USD"}
    assert result.copied == ["account_id"] and "SAV-9" in result.text
    error = (await policy.rehearse(call)).parsed
    assert error.status == "tool_error" and not error.copied


LISTING = ToolSpec.from_dict({"name": "list_items", "description": "items of a category", "server": "inventory",
                              "input_schema": {"type": "object"}})


def listings(n, *, moved=0):
    """`n` listings by one of two categories: each category's items (names, skus) stay, their stock moves
    with every call; after the first `moved` repeats a category lists a new item first."""
    calls = []
    for i in range(n):
        category = ("office", "garden")[i % 2]
        items = [{"sku": f"{category[:3].upper()}-{k}", "name": f"{category} {k}", "on_hand": 10 * i + k}
                 for k in range(3)]
        if 2 <= i < 2 + moved:
            items.insert(0, {"sku": "NEW-1", "name": "new", "on_hand": 1})
        calls.append(observed("list_items", {"category": category, "page": i}, {"category": category, "items": items}))
    return calls


def test_fields_that_repeat_for_the_same_argument_are_looked_up_in_the_log_with_the_list_elements_they_sit_in(tmp_path):
    lookups = learn_lookups(listings(14))
    assert [lookup.key for lookup in lookups["list_items"]] == ["category"]  # `page` tells nothing; all arguments never repeat
    (lookup,) = lookups["list_items"]
    assert set(lookup.held) == {"category", *(f"items[{k}].{f}" for k in range(3) for f in ("sku", "name"))}
    assert lookup.held["items[2].sku"] == (1.0, 12) and "items[0].on_hand" not in lookup.held  # stock moves
    assert learn_lookups(listings(14, moved=1)) == {}  # 10 of 12: only the category repeats, which the call says
    assert learn_lookups(listings(MIN_SUPPORT + 1)) == {}  # 4 repeats: too few to say
    stable, found, kinds = learn_replies(listings(14) + catalog(12))
    assert list(stable) == ["list_rooms"] and list(found) == ["list_items"]  # a stable tool needs no lookup
    assert kinds == {"list_items": "object", "list_rooms": "object"}
    write_rules(tmp_path, {}, {"list_items": (LISTING.server, LISTING.behaviour)}, {}, lookups)
    table = read_rules(tmp_path)
    assert table.summary()["list_items"][0].startswith("category, items[].name, items[].sku = the logged value for the same category")
    guess = Prediction(tool="list_items", status="result", text="{...}",
                       result={"category": "office", "items": [{"sku": "X", "name": "made up", "on_hand": 7}]})
    got = table.apply(guess, request({"category": "garden", "page": 99}, spec=LISTING))
    assert got.result == {"category": "garden", "items": [{"sku": "GAR-0", "name": "garden 0", "on_hand": 7},
                                                          {"sku": "GAR-1", "name": "garden 1"},
                                                          {"sku": "GAR-2", "name": "garden 2"}]}
    assert got.copied == ["category", "items[].name", "items[].sku"] and got.text == "{...}"
    assert guess.result["items"][0]["sku"] == "X"  # the model's own prediction is not changed in place
    assert table.apply(guess, request({"category": "kitchen"}, spec=LISTING)) == guess  # never logged: the model's
    cut = Prediction(tool="list_items", status="result", code="CUT", partial=True, result=None, text='{"cat')
    assert table.apply(cut, request({"category": "office"}, spec=LISTING)).result["items"][1] == {"sku": "OFF-1", "name": "office 1"}
    error = Prediction(tool="list_items", status="tool_error", code="EXECUTION_ERROR", message="down")
    assert table.apply(error, request({"category": "office"}, spec=LISTING)) == error  # never turns a failure into a reply
    moved = ToolSpec.from_dict({"name": "list_items", "description": "items of a category", "server": "other",
                                "input_schema": {"type": "object"}})
    assert table.apply(guess, request({"category": "garden"}, spec=moved)) == guess  # another server's tool


def test_a_lookup_fills_a_reply_that_is_a_list_and_replaces_what_the_model_wrote_where_an_object_belongs(tmp_path):
    flights = [observed("search", {"origin": origin}, [{"flight": f"{origin}1", "seats": i}, {"flight": f"{origin}2"}])
               for i in range(7) for origin in ("JFK", "HAT")]
    lookups = learn_lookups(flights)
    assert [(lookup.key, sorted(lookup.held)) for lookup in lookups["search"]] == [("origin", ["[0].flight", "[1].flight"])]
    spec = ToolSpec.from_dict({"name": "search", "description": "flights", "server": "air", "input_schema": {"type": "object"}})
    write_rules(tmp_path, {}, {"search": (spec.server, spec.behaviour)}, {}, lookups)
    table = read_rules(tmp_path)
    cut = Prediction(tool="search", status="result", code="CUT", partial=True, result=None, text="[{")
    assert table.apply(cut, request({"origin": "JFK"}, spec=spec)).result == [{"flight": "JFK1"}, {"flight": "JFK2"}]
    odd = Prediction(tool="search", status="result", result=["JFK1", {"flight": "X", "seats": 3}])
    assert table.apply(odd, request({"origin": "JFK"}, spec=spec)).result == [{"flight": "JFK1"}, {"flight": "JFK2", "seats": 3}]
    whole = Prediction(tool="search", status="result", result={"flights": []})
    assert table.apply(whole, request({"origin": "JFK"}, spec=spec)) == whole  # a reply of the other kind: left alone


def test_a_rules_files_lookups_are_untrusted_input(tmp_path):
    held = {"room_name": [1.0, 9], "bookings[0].id": [1.0, 9], "weak": [0.5, 9], "few": [1.0, 2],
            "bookings[9999].id": [1.0, 9], "a..b": [1.0, 9], "x" * 300: [1.0, 9]}
    values = [["R-1", {"room_name": "Elm", "bookings[0].id": "BK-1", "weak": 1, "deep": 2}],
              ["R-2", {"room_name": {"rm": "-rf"}}], [{"room_id": "R-3"}], "R-4", None]
    entry = {"server": "booking", "behaviour": "b", "rules": []}
    (tmp_path / RULES_FILE).write_text(json.dumps({"tools": {
        "list_bookings": {**entry, "lookups": [{"key": "room_id", "held": held, "values": values},
                                               {"key": "", "held": held, "values": values}, "junk", None]},
        "unbound": {"server": "booking", "rules": [], "lookups": [{"key": "room_id", "held": held, "values": values}]},
        "nothing": {**entry, "lookups": [{"key": "room_id", "held": {"weak": [0.5, 9]}, "values": values}]}}}))
    table = read_rules(tmp_path)
    assert list(table.lookups) == ["list_bookings"]
    (lookup,) = table.lookups["list_bookings"][1]
    assert set(lookup.held) == {"room_name", "bookings[0].id"}  # weak, unsupported, too long or malformed: dropped
    assert lookup.values == {'"R-1"': {"room_name": "Elm", "bookings[0].id": "BK-1"}}  # an object is no field's value


def shown(items):
    """A run's history in which `get_item` showed each of `items` (and a failed call's JSON error, which shows nothing)."""
    history = [HumanMessage(content="hold some")]
    for i, item in enumerate([*items, {"sku": items[0]["sku"], "unit_price": 0.0}]):
        failed = i == len(items)
        history += [AIMessage(content="", tool_calls=[{"name": "get_item", "args": {"sku": item["sku"]}, "id": f"g{i}"}]),
                    ToolMessage(content=json.dumps(item), tool_call_id=f"g{i}", status="error" if failed else "success")]
    return history


def test_a_field_equal_to_that_of_what_an_argument_names_as_the_run_showed_it_becomes_a_state_rule(tmp_path):
    calls = []
    for i in range(12):  # each run read two items, then reserved the first: the latest price read is the other's
        first, second = {"sku": f"A-{i}", "unit_price": 2.0 + i}, {"sku": f"B-{i}", "unit_price": 50.0 + i}
        calls.append(observed("reserve", {"sku": first["sku"], "quantity": 1},
                              {"sku": first["sku"], "unit_price": first["unit_price"]},
                              earlier=[first, second], history=shown([first, second])))
    rules = {r.field: r for r in learn(calls)["reserve"]}
    assert (rules["unit_price"].source, rules["unit_price"].name, rules["unit_price"].held) == ("state", "sku", 1.0)
    assert rules["sku"].source == "argument"  # on a tie the call's own argument wins
    write_rules(tmp_path, learn(calls), {"reserve": (SPEC.server, SPEC.behaviour)})
    table = read_rules(tmp_path)
    assert "unit_price = that of what sku names, as shown (held in 100% of 12)" in table.summary()["reserve"]
    guess = Prediction(tool="reserve", status="result", result={"sku": "X", "unit_price": 1.0, "total": 3.0})
    history = shown([{"sku": "OFF-7", "unit_price": 9.5}, {"sku": "OFF-8", "unit_price": 4.0}])
    got = table.apply(guess, request({"sku": "OFF-7", "quantity": 3}, history))
    assert got.result == {"sku": "OFF-7", "unit_price": 9.5, "total": 3.0} and sorted(got.copied) == ["sku", "unit_price"]
    unseen = table.apply(guess, request({"sku": "OFF-9", "quantity": 3}, history))  # the run never showed OFF-9
    assert unseen.result["unit_price"] == 1.0 and unseen.copied == ["sku"]


def test_what_a_lookup_makes_is_bounded_and_never_leaves_a_gap(tmp_path):
    # a crafted file, every entry well formed: 8 lookups of 256 paths, each 30 lists deep
    def paths(k):
        return {f"[{j}]" + "[0]" * 30 + f".f{k}": 0 for j in range(256)}
    lookups = [{"key": "category", "held": {p: [1, 5] for p in paths(k)}, "values": [["office", paths(k)]]}
               for k in range(8)]
    (tmp_path / RULES_FILE).write_text(json.dumps({"tools": {"list_items": {
        "server": LISTING.server, "behaviour": LISTING.behaviour, "rules": [], "lookups": lookups}}}))
    cut = Prediction(tool="list_items", status="result", code="CUT", partial=True, result=None, text="[")
    made, stack, count = read_rules(tmp_path).apply(cut, request({"category": "office"}, spec=LISTING)).result, [], 0
    stack.append(made)
    while stack:
        item = stack.pop()
        count += isinstance(item, (dict, list))
        stack.extend(item if isinstance(item, list) else item.values() if isinstance(item, dict) else [])
    assert made and count <= MAX_MADE + 1  # what it makes, at most MAX_MADE elements and objects
    # a listing whose second element changes from call to call: the first and third repeat
    calls = [observed("list_items", {"category": category},
                      {"items": [{"sku": f"{category}-A"}, {"sku": f"B-{n}"}, {"sku": f"{category}-C"}]})
             for n in range(8) for category in ("office", "garden")]
    write_rules(tmp_path, {}, {"list_items": (LISTING.server, LISTING.behaviour)}, {}, learn_lookups(calls))
    got = read_rules(tmp_path).apply(cut, request({"category": "office"}, spec=LISTING))
    assert got.result == {"items": [{"sku": "office-A"}]}  # no element the server never wrote (a null) before "C"
    guess = Prediction(tool="list_items", status="result", result={"items": [{"sku": "X"}, {"sku": "Y"}]})
    assert read_rules(tmp_path).apply(guess, request({"category": "office"}, spec=LISTING)).result == {
        "items": [{"sku": "office-A"}, {"sku": "Y"}, {"sku": "office-C"}]}  # next to what the model wrote, it may grow


def test_learning_keeps_only_fields_a_rules_file_can_hold(tmp_path):
    calls = [observed("list_items", {"category": category}, {"a.b": category, "items": [{"sku": f"{category}-{i}"}
                                                                                      for i in range(300)], "k" * 300: category})
             for _ in range(8) for category in ("office", "garden")]
    (lookup,) = learn_lookups(calls)["list_items"]
    assert "a.b" not in lookup.held and not any(p.startswith("k") for p in lookup.held)  # no path spells them
    assert list(lookup.held)[:3] == ["items[0].sku", "items[1].sku", "items[2].sku"] and len(lookup.held) == 256
    assert "items[255].sku" in lookup.held and "items[256].sku" not in lookup.held
    # a catalog that fits its budget as computed fits the file as written; read back whole
    catalogs = [observed("rooms", {"building": b}, {"rooms": [{"id": f"{b}-{i}", "seats": i, "av": [True]}
                                                              for i in range(230)]}) for _ in range(3) for b in range(64)]
    stable, found, _ = learn_replies(catalogs)
    rules = {"reserve": learn(reservations(20))["reserve"]}
    path = write_rules(tmp_path, rules, {"rooms": ("b", "x"), "reserve": (SPEC.server, SPEC.behaviour)}, stable, found)
    table = read_rules(tmp_path)
    assert path.stat().st_size <= MAX_BYTES and table.stable["rooms"][1] == stable["rooms"] and "reserve" in table.tools
