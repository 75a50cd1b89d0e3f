"""Probes: reference prefixes with one perturbed call, answered by the real bank server (in-process),
recorded with a real tokenizer, and turned into rehearse-only SFT rows aimed at the real replies."""

import random
import re

import anyio
import pytest

from envace_mcp.lab.probes import mutations, task_probes
from envace_mcp.traces import TraceStore

SCHEMA = {"type": "object", "properties": {
    "account_id": {"type": "string"}, "amount": {"type": "number", "exclusiveMinimum": 0},
    "side": {"enum": ["buy", "sell"], "type": "string"}, "limit": {"type": "integer", "maximum": 50},
    "limit_price": {"anyOf": [{"type": "number"}, {"type": "null"}]}}}


def test_mutations_mistype_ids_swap_seen_ids_scale_and_halve_numbers_and_flip_enums():
    found = {(m, f, str(a[f])) for m, f, a in mutations(
        {"account_id": "CHK-9995", "amount": 20.5, "side": "buy", "flag": True},
        SCHEMA, "accounts CHK-1234, SAV-7777 and CHK-9995")}
    assert found == {("drop_digit", "account_id", "CHK-999"), ("digit", "account_id", "CHK-9996"),
                     ("swap", "account_id", "CHK-1234"),  # same kind of id only; never itself
                     ("scale", "amount", "2050.0"), ("halve", "amount", "10.25"),
                     ("enum", "side", "sell")}  # booleans are left alone
    halved = {a["limit"] for m, f, a in mutations({"limit": 7}, SCHEMA, "") if m == "halve"}
    assert halved == {3} and not [m for m, _, _ in mutations({"limit": 1}, SCHEMA, "") if m == "halve"]  # ints stay ints, never 0


def test_retail_ids_with_a_hash_or_a_snake_case_prefix_and_ids_in_lists_are_mistyped_and_swapped():
    seen = "orders #W4527346 and #W1000001; items I-13888, I-20000; gift_card_3561, gift_card_1000, credit_card_2222"
    found = {(m, f, str(a[f.split("[")[0]])) for m, f, a in mutations(
        {"order_id": "#W4527346", "item_ids": ["I-13888"], "payment_method_id": "gift_card_3561"}, {}, seen)}
    assert found == {
        ("drop_digit", "order_id", "#W452734"), ("digit", "order_id", "#W4527347"), ("swap", "order_id", "#W1000001"),
        ("drop_digit", "item_ids[0]", "['I-1388']"), ("digit", "item_ids[0]", "['I-13889']"),
        ("swap", "item_ids[0]", "['I-20000']"),  # an item of another order: not in this one
        ("drop_digit", "payment_method_id", "gift_card_356"), ("digit", "payment_method_id", "gift_card_3562"),
        ("swap", "payment_method_id", "gift_card_1000")}  # another gift card, never the credit card
    assert not list(mutations({"street": "7 Pine Rd", "zip": "82501", "symbol": "AAPL"}, {}, seen))  # no id, no change


def test_task_probes_keep_what_the_schema_accepts_and_take_each_family_before_any_twice():
    from envace_mcp.envs import get_suite
    from envace_mcp.toolbox.validation import ArgumentValidator

    suite = get_suite("bank")
    task = next(t for t in suite.split("train") if t.kind == "statement_spending")  # get_statement(limit=...)
    validator = ArgumentValidator(SCHEMA)
    valid = lambda tool, arguments: not validator.errors(arguments)  # noqa: E731
    results = [suite.reference_result(task, task.actions[:i], a.tool, dict(a.arguments)) for i, a in enumerate(task.actions)]
    probes = task_probes(task, results, {a.tool: SCHEMA for a in task.actions}, valid, per_call=2, rng=random.Random(0))
    assert probes and all(not validator.errors(p.call.arguments) for p in probes)
    assert not any(p.mutation == "scale" and p.field == "limit" and p.call.arguments["limit"] > 50 for p in probes)
    assert sorted("typo" if p.mutation in ("digit", "drop_digit") else p.mutation for p in probes) == ["halve", "typo"]
    typos = task_probes(task, results, {a.tool: SCHEMA for a in task.actions}, valid, per_call=2, rng=random.Random(0),
                        kinds=["typo", "scale", "enum", "swap"])
    assert [p.mutation for p in typos] in (["digit", "drop_digit"], ["drop_digit", "digit"])  # the only family left
    transfer = next(t for t in suite.split("train") if t.kind == "transfer_funds")  # ids and an amount
    done = [suite.reference_result(transfer, [], a.tool, dict(a.arguments)) for a in transfer.actions]
    for seed in range(5):
        picked = task_probes(transfer, done, {}, valid, per_call=2, rng=random.Random(seed))
        families = ["typo" if p.mutation in ("digit", "drop_digit") else p.mutation for p in picked]
        assert len(families) == 2 and len(set(families)) == 2  # two families before any twice
    again = task_probes(task, results, {a.tool: SCHEMA for a in task.actions}, valid, per_call=2, rng=random.Random(0))
    assert again == probes  # seeded
    for kinds, allowed in ((["halve", "swap"], {"halve", "swap"}), (["typo"], {"digit", "drop_digit"}), (["digit"], {"digit"})):
        kept = task_probes(transfer, done, {}, valid, per_call=3, rng=random.Random(0), kinds=kinds)
        assert kept and {p.mutation for p in kept} <= allowed  # a family or one mutation; nothing else


def test_a_misspelt_or_empty_kind_is_an_error_not_a_run_without_probes(tmp_path):
    from envace_mcp.errors import UserError
    from envace_mcp.lab.probes import check_kinds, record_probe_traces

    assert check_kinds(None) is None and check_kinds(["typo", "halve"]) == {"typo", "halve"}
    for kinds, why in ((["typos"], "unknown typos; choose from typo"), ([], "unknown (none given)")):
        with pytest.raises(UserError, match=re.escape(why)):
            anyio.run(lambda: record_probe_traces(None, "bank", tmp_path, split="fit", kinds=kinds))
    assert not list(tmp_path.iterdir())  # refused before anything was written


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    from envace_mcp.policy import load_policy
    from envace_mcp.testing import build_tiny_qwen3

    folder = build_tiny_qwen3(tmp_path_factory.mktemp("tiny"))
    return load_policy(str(folder), tool_format="compact", rehearse_format="inline")


def test_probe_runs_hold_one_rehearsal_aimed_at_the_real_reply_and_train_nothing_else(tiny_policy, tmp_path):
    from envace_mcp.lab.probes import record_probe_traces
    from envace_mcp.toolbox import ToolResult
    from envace_mcp.train.sft import sft_rows, target_encoding

    summary = anyio.run(lambda: record_probe_traces(tiny_policy, "bank", tmp_path, split="fit", limit=4, per_call=2))
    runs = list(TraceStore(tmp_path).read())
    assert summary.runs == len(runs) > 4 and 0 < summary.real_errors <= len(runs)
    errors = 0
    for run in runs:
        probe = run.metadata["probe"]
        rehearsals = [s for s in run.steps if s.role == "rehearse"]
        assert [s.call_id for s in rehearsals] == [probe["call_id"]]  # the prefix's are the reference run's rows
        tool = next(s for s in run.steps if s.role == "tool" and s.call_id == probe["call_id"])
        assert not tool.simulated and (tool.tool, tool.arguments) == (probe["tool"], probe["arguments"])
        assert tool.comparison.score == 1.0  # the forced perfect rehearsal (the domain) agreed with the server
        assert tool.comparison.status_match is True  # recorded from the comparison, not left unknown
        assert run.reward("task") is None  # nothing scores a probe: SFT takes none of its act turns
        errors += bool(tool.result.get("is_error"))
    assert errors == summary.real_errors
    assert any("Unknown account" in ToolResult.text_of(s.result) for r in runs for s in r.steps if s.role == "tool")
    encode, end = target_encoding(tiny_policy.tokenizer)
    rows = sft_rows(runs, encode, end)
    assert len(rows) == len(runs) and {r.role for r in rows} == {"rehearse"}
    first = next(s for s in runs[0].steps if s.role == "tool" and s.call_id == runs[0].metadata["probe"]["call_id"])
    assert tiny_policy.tokenizer.decode(rows[0].completion_ids).startswith(ToolResult.text_of(first.result)[:40])


def test_probes_with_the_models_own_rehearsals_score_its_world_model_on_wrong_calls(tiny_policy, tmp_path):
    from envace_mcp.lab.probes import record_probe_traces
    from envace_mcp.policy import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    summary = anyio.run(lambda: record_probe_traces(tiny_policy, "bank", tmp_path, split="validation", limit=2,
                                                    per_call=1, own_rehearsals=True, sampling={"rehearse": greedy}))
    report = summary.to_dict()
    assert report["runs"] == len(list(TraceStore(tmp_path).read())) > 0
    assert report["field_accuracy"] == 0.0 and report["status_accuracy"] == 0.0  # a random model: unusable guesses
    for run in TraceStore(tmp_path).read():
        rehearsal = next(s for s in run.steps if s.role == "rehearse")
        assert len(rehearsal.completion_ids) <= 8  # sampled by the model, not forced


def test_retail_probes_reach_real_errors_on_the_retail_server(tiny_policy, tmp_path):
    """Retail's calls carry `#W` order ids, item id lists and snake-case payment ids: mistyped or swapped,
    the real retail server refuses them (before, its probes were mostly right calls)."""
    from envace_mcp.lab.probes import record_probe_traces
    from envace_mcp.toolbox import ToolResult

    summary = anyio.run(lambda: record_probe_traces(tiny_policy, "retail", tmp_path, split="fit", limit=6, per_call=2,
                                                    kinds=["typo", "swap"]))
    runs = list(TraceStore(tmp_path).read())
    assert summary.runs == len(runs) > 6
    probed = [(r.metadata["probe"], next(s for s in r.steps if s.role == "tool" and s.call_id == r.metadata["probe"]["call_id"]))
              for r in runs]
    errors = [(p, s) for p, s in probed if s.result.get("is_error")]
    assert len(errors) == summary.real_errors and len(errors) >= len(runs) // 2
    assert any(p["field"].startswith("item_ids[") and "are not in order" in ToolResult.text_of(s.result)
               for p, s in errors)  # an id in a list, changed alone: an item the order does not hold
    assert any(p["field"] == "order_id" and "Unknown order" in ToolResult.text_of(s.result) for p, s in errors)
