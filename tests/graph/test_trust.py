"""The trust table: the gate acts on a world model's predictions only for the tools it was measured on."""

import json

import pytest

from envace_mcp.errors import UserError
from envace_mcp.graph import EnvaceContext, GateConfig, ToolTrust, gate_for, read_trust
from envace_mcp.graph.gate import decide
from envace_mcp.graph.served import loosened
from envace_mcp.policy import Prediction, ToolCall
from envace_mcp.policy.trust import weights_digest
from envace_mcp.toolbox import ToolAnnotations, ToolSpec

DELETE = ToolSpec.create(remote_name="delete_todo", server="todo", description="", input_schema={"type": "object"},
                         output_schema=None, annotations=ToolAnnotations.from_hints({"destructiveHint": True}))
NOTE = ToolSpec.create(remote_name="add_note", server="crm", description="", input_schema={"type": "object"},
                       output_schema=None, annotations=ToolAnnotations.from_hints({"destructiveHint": False}))
CALL = ToolCall(id="1", name="delete_todo", arguments={"id": "t9"})
FAILS = Prediction(tool="delete_todo", status="tool_error", code="EXECUTION_ERROR", message="no such to-do")
FINE = Prediction(tool="delete_todo", status="result", result={"deleted": "t9"})
GARBLED = Prediction(tool="delete_todo", status="invalid", code="NOT_JSON")


def gate(trust, **settings):
    return GateConfig(trust=trust, **{"require_approval": "never", **settings})


def test_a_tool_the_table_does_not_name_is_shown_not_acted_on():
    """The new user's to-do server under the shipped world model: before, every garbled rehearsal of
    `delete_todo` blocked it (failing closed) and every predicted failure stopped it."""
    measured_elsewhere = {"transfer_funds": ToolTrust(believe_failures=True, fail_closed=True)}
    for prediction in (FAILS, GARBLED):
        decision = decide(CALL, DELETE, prediction, mode="real", config=gate(measured_elsewhere, on_unusable="block"))
        assert decision.action == "execute"
        assert "was not measured on 'delete_todo'" in decision.reason and prediction.code in decision.reason
        asked = decide(CALL, DELETE, prediction, mode="real", config=gate(measured_elsewhere, require_approval="destructive"))
        assert asked.action == "ask" and "shown, not acted on" in asked.reason  # the approver sees the prediction
    # without a table, as before: the prediction is acted on
    assert decide(CALL, DELETE, FAILS, mode="real", config=gate(None)).action == "block"
    assert decide(CALL, DELETE, GARBLED, mode="real", config=gate(None, on_unusable="block")).action == "block"


def test_a_tool_measured_reliable_is_stopped_by_its_predicted_failure_and_an_unreliable_one_is_not():
    trusted = decide(CALL, DELETE, FAILS, mode="real", config=gate({"delete_todo": ToolTrust(believe_failures=True)}))
    assert trusted.action == "block"
    unreliable = decide(CALL, DELETE, FAILS, mode="real", config=gate({"delete_todo": ToolTrust(fail_closed=True)}))
    assert unreliable.action == "execute" and "not measured reliable" in unreliable.reason
    feedback = decide(ToolCall(id="2", name="add_note"), NOTE, FAILS.model_copy(update={"tool": "add_note"}),
                      mode="real", config=gate({"add_note": ToolTrust(believe_failures=True)}))
    assert feedback.action == "feedback"


def test_a_predicted_success_skips_approval_only_where_the_caller_asks_for_measured_approval():
    table = {"delete_todo": ToolTrust(believe_failures=True, fail_closed=True, skip_approval=True)}
    assert decide(CALL, DELETE, FINE, mode="real", config=gate(table, require_approval="destructive")).action == "ask"
    measured = decide(CALL, DELETE, FINE, mode="real", config=gate(table, require_approval="measured"))
    assert measured.action == "execute" and "measured reliable" in measured.reason
    asks = gate(table, require_approval="measured")
    # nothing vouched for: a believed failure blocks, an unreadable rehearsal or none at all is asked
    assert decide(CALL, DELETE, FAILS, mode="real", config=asks).action == "block"
    for prediction in (GARBLED, None):
        assert decide(CALL, DELETE, prediction, mode="real", config=asks).action == "ask"
    unearned = {"delete_todo": ToolTrust(believe_failures=True)}
    assert decide(CALL, DELETE, FINE, mode="real", config=gate(unearned, require_approval="measured")).action == "ask"


class _Policy:
    """A policy as `load_policy` leaves one: its adapter folder and the trust table read from it, once."""

    def __init__(self, folder):
        self.adapter_folder = folder
        self.trust = read_trust(folder)


EARNED = {"calls": 40, "failures": 8, "status_accuracy": 0.95, "floors": {"always_succeeds": 0.8, "majority": 0.8},
          "predicted_successes": 31, "success_precision": 1.0,
          "stop_curve": [{"p_error": 0.5, "stopped": 9, "precision": 0.78}, {"p_error": 0.6, "stopped": 7, "precision": 0.86}]}


def _table(folder, tools, weights="match"):
    (folder / "adapter_model.safetensors").write_bytes(b"the weights measured")
    bound = weights_digest(folder) if weights == "match" else weights
    (folder / "trust.json").write_text(json.dumps({"tools": tools, "weights": bound, "measured_on": {}}))


def test_gates_take_the_world_models_table_from_the_policy_wherever_they_are_resolved(tmp_path):
    _table(tmp_path, {"delete_todo": {"believe_failures": True, "fail_closed": True, **EARNED}})
    expected = {"delete_todo": ToolTrust(believe_failures=True, min_p_error=0.6, fail_closed=True)}
    assert read_trust(tmp_path).tools == expected and not read_trust(tmp_path).notes
    policy = _Policy(tmp_path)
    assert gate_for(policy).trust == expected
    given = gate_for(policy, GateConfig(require_approval="never"))  # a gate of the caller's own keeps the table
    assert given.trust == expected and given.require_approval == "never"
    assert EnvaceContext(policy=policy).gate.trust == expected
    assert gate_for(_Policy(None)).trust is None


def test_a_believed_failure_stops_only_at_the_p_error_its_tool_earned():
    table = {"delete_todo": ToolTrust(believe_failures=True, min_p_error=0.6)}
    sure = FAILS.model_copy(update={"p_error": 0.9})
    unsure = FAILS.model_copy(update={"p_error": 0.55})
    assert decide(CALL, DELETE, sure, mode="real", config=gate(table)).action == "block"
    shown = decide(CALL, DELETE, unsure, mode="real", config=gate(table))
    assert shown.action == "execute" and "believed only at P(error) ≥ 0.6" in shown.reason


def test_a_hostile_table_loosens_nothing_and_each_refusal_is_one_line_naming_the_file(tmp_path):
    """From outside: a trust.json that claims skip_approval with no figures (or figures that contradict it)
    let a destructive call run unasked under require_approval=measured; an empty table switched off every
    stop silently; a table written for other weights was believed."""
    _table(tmp_path, {"delete_todo": {"skip_approval": True},
                      "add_note": {"believe_failures": True, "skip_approval": True, **EARNED, "status_accuracy": 0.7}})
    table = read_trust(tmp_path)
    assert table.tools["delete_todo"] == ToolTrust() and not table.tools["add_note"].believe_failures
    assert len(table.notes) == 2 and all(str(tmp_path / "trust.json") in note and "not believed" in note
                                         for note in table.notes)
    assert "does not beat its floor" in table.notes[1]
    measured = gate(table.tools, require_approval="measured")
    assert decide(CALL, DELETE, FINE, mode="real", config=measured).action == "ask"
    _table(tmp_path, {})
    empty = read_trust(tmp_path)
    assert empty.tools == {} and "names no tool" in empty.notes[0]
    for weights in ("0" * 32, None):  # other weights, or none at all: nothing it claims is believed
        _table(tmp_path, {"delete_todo": {"believe_failures": True, "skip_approval": True, **EARNED}}, weights)
        table = read_trust(tmp_path)
        assert not table.tools["delete_todo"].believe_failures and not table.tools["delete_todo"].skip_approval
        assert "other weights" in table.notes[0] if weights else "bound to no weights" in table.notes[0]


def test_an_entry_covers_only_the_tool_it_measured():
    """Keyed by name alone, another server's `delete_todo` inherited this one's trust."""
    table = {"delete_todo": ToolTrust(believe_failures=True, server="todo", behaviour=DELETE.behaviour)}
    assert decide(CALL, DELETE, FAILS, mode="real", config=gate(table)).action == "block"
    other = ToolSpec.create(remote_name="delete_todo", server="crm", description="", input_schema={"type": "object"},
                            output_schema=None, annotations=ToolAnnotations.from_hints({"destructiveHint": True}))
    changed = ToolSpec.create(remote_name="delete_todo", server="todo", description="",
                              input_schema={"type": "object", "properties": {"all": {"type": "boolean"}}},
                              output_schema=None, annotations=ToolAnnotations.from_hints({"destructiveHint": True}))
    for spec in (other, changed):
        decision = decide(CALL, spec, FAILS, mode="real", config=gate(table))
        assert decision.action == "execute" and "was not measured on" in decision.reason


@pytest.mark.parametrize("text", ["{torn", '{"tools": []}', '{"tools": {"x": {"stop": "perhaps"}}}'])
def test_a_torn_trust_table_is_one_error_naming_it(tmp_path, text):
    (tmp_path / "trust.json").write_text(text)
    with pytest.raises(UserError, match=r"trust\.json: not a trust table"):
        read_trust(tmp_path)


def test_a_served_caller_cannot_replace_the_deployments_trust_table():
    deployed = GateConfig(trust={"delete_todo": ToolTrust(believe_failures=True)})
    assert "trust table" in loosened(deployed, {"trust": {"delete_todo": {"stop": True, "skip_approval": True}}})
    assert "fewer calls" in loosened(GateConfig(), {"require_approval": "measured"})


def test_the_shipped_world_model_fails_closed_on_the_bundled_tools_it_was_measured_on_and_nowhere_else(bank_catalog):
    """Its table is a report's (docs/evidence.md), bound to its weights and to the bundled tools: a user's
    own delete is asked about with the prediction shown; the real bank `transfer` fails closed."""
    from envace_mcp.policy.embedded import embedded_adapter

    policy = _Policy(embedded_adapter())
    assert policy.trust.notes == []  # a generated table: every flag earned by its own figures
    shipped = gate_for(policy, GateConfig(require_approval="never", on_unusable="block"))
    assert shipped.trust["transfer"].fail_closed and not any(t.skip_approval for t in shipped.trust.values())
    assert decide(CALL, DELETE, GARBLED, mode="real", config=shipped).action == "execute"
    transfer = next(s for s in bank_catalog if s.name == "transfer")
    move = ToolCall(id="2", name="transfer", arguments={"from_account_id": "CHK-1001", "to_account_id": "SAV-1001",
                                                      "amount": 5})
    assert decide(move, transfer, GARBLED, mode="real", config=shipped).action == "block"


def test_a_world_model_folder_without_a_report_is_refused_in_one_line(tmp_path):
    from envace_mcp.policy.roles import with_world_model

    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(UserError, match="has no report \\(trust.json\\): measure it first, envace world-model report"):
        with_world_model(_Policy(None), tmp_path)
    with pytest.raises(UserError, match="no adapter there"):
        with_world_model(_Policy(None), tmp_path / "missing")


@pytest.mark.parametrize("figures", [
    {"floors": [0.1]}, {"floors": "always"}, {"floors": {"always_succeeds": -1.0}},
    {"status_accuracy": 7}, {"status_accuracy": 10**400}, {"success_precision": 9},
    {"predicted_successes": float("inf")}, {"predicted_successes": "1000"}, {"predicted_successes": True},
    {"stop_curve": [{"p_error": 0.5, "stopped": float("inf"), "precision": 0.9}]},
    {"stop_curve": [{"p_error": 10**400, "stopped": 9, "precision": 0.9}]},
    {"stop_curve": [{"p_error": -1, "stopped": 9, "precision": 0.9}]},
    {"stop_curve": [{"p_error": 5, "stopped": 9, "precision": 0.9}]},
    {"stop_curve": [{"p_error": "nan", "stopped": 9, "precision": 0.9}]},
    {"stop_curve": [[[[0.5]]], {"p_error": {"__proto__": 0.5}, "stopped": 9, "precision": 0.9}]},
], ids=["floors a list", "floors a string", "a negative floor", "status 7", "status of 400 digits",
        "success precision 9", "infinite successes", "successes as a string", "successes as a boolean",
        "infinite stops", "P(error) of 400 digits", "P(error) -1", "P(error) 5", "P(error) NaN", "nested garbage"])
def test_figures_that_are_not_a_reports_earn_nothing_and_never_crash_the_load(tmp_path, figures):
    """From outside: floors that were not an object, an infinite or 400-digit count, took the policy's load
    down with a traceback; a P(error) threshold of -1, 5 or NaN, a status of 7, a count written as a string
    were believed as figures."""
    _table(tmp_path, {"delete_todo": {"believe_failures": True, "skip_approval": True, "server": "todo",
                                      "behaviour": DELETE.behaviour, **EARNED, **figures}})
    table = read_trust(tmp_path)
    assert table.tools["delete_todo"].model_dump(include={"believe_failures", "min_p_error", "skip_approval"}) == {
        "believe_failures": False, "min_p_error": None, "skip_approval": False}
    assert len(table.notes) == 1 and "not a report's" in table.notes[0]


@pytest.mark.parametrize("text", ['{"tools": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                  '{"tools": {}, "padding": "' + "x" * (8 << 20) + '"}'],
                         ids=["nested 100,000 deep", "past 8 MiB"])
def test_a_trust_table_too_deep_or_too_large_to_be_a_reports_is_one_error_naming_it(tmp_path, text):
    (tmp_path / "trust.json").write_text(text)
    with pytest.raises(UserError, match=r"trust\.json: not a trust table"):
        read_trust(tmp_path)


def test_a_table_whose_folder_has_no_weights_file_to_check_it_against_is_not_believed(tmp_path):
    """From outside: with its weights as adapter_model.bin (which PEFT loads too), a table claiming any digest
    at all passed for bound."""
    (tmp_path / "adapter_model.bin").write_bytes(b"other weights")
    (tmp_path / "trust.json").write_text(json.dumps({"tools": {"delete_todo": {
        "believe_failures": True, "skip_approval": True, **EARNED}}, "weights": "0" * 32}))
    table = read_trust(tmp_path)
    assert not table.tools["delete_todo"].believe_failures and not table.tools["delete_todo"].skip_approval
    assert "adapter_model.safetensors" in table.notes[0]


def test_a_predicted_success_vouches_only_for_the_tool_its_entry_binds(tmp_path):
    """From outside: an entry naming no server and schema stood in for approval of every server's tool of its
    name; what replaces a person's consent must say which tool it measured (a report's entries always do)."""
    _table(tmp_path, {"delete_todo": {"skip_approval": True, **EARNED}})
    table = read_trust(tmp_path)
    assert not table.tools["delete_todo"].skip_approval and "bind its tool" in table.notes[0]
    other = ToolSpec.create(remote_name="delete_todo", server="crm", description="", input_schema={"type": "object"},
                            output_schema=None, annotations=ToolAnnotations.from_hints({"destructiveHint": True}))
    assert decide(CALL, other, FINE, mode="real", config=gate(table.tools, require_approval="measured")).action == "ask"
    _table(tmp_path, {"delete_todo": {"skip_approval": True, "server": "todo", "behaviour": DELETE.behaviour, **EARNED}})
    assert read_trust(tmp_path).tools["delete_todo"].skip_approval


def test_a_hostile_tool_name_reaches_the_terminal_and_the_log_escaped(tmp_path, monkeypatch):
    """From outside: a tool named `[/]` crashed `envace run` as it announced the table (rich markup), one
    named `[conceal]` hid the rest of its line, and an ESC in a name reached the terminal raw through the log."""
    from io import StringIO

    from rich.console import Console

    import envace_mcp.cli._common as common

    names = ["x[/]y", "[conceal]hidden", "wipe\x1bc"]
    _table(tmp_path, {name: {"skip_approval": True} for name in names})
    policy = _Policy(tmp_path)
    assert all("\x1b" not in note for note in policy.trust.notes)
    out = StringIO()
    monkeypatch.setattr(common, "console", Console(file=out, force_terminal=True, width=400))
    common.announce_trust(policy)
    shown = out.getvalue()
    assert "x[/]y" in shown and "[conceal]hidden" in shown and "wipe\\x1bc" in shown
    assert "\x1b[8" not in shown and "\x1bc" not in shown  # nothing concealed, nothing obeyed


def test_the_tools_that_may_earn_trust_are_named_as_written():
    """From outside: `envace world-model fit` crashed before training on a recorded tool named `[/]`."""
    from types import SimpleNamespace

    from rich.console import Console

    from envace_mcp.cli.world_model import room_for_trust

    held = [SimpleNamespace(tool=name, failed=True) for name in ("x[/]y", "[conceal]z") for _ in range(3)]
    console = Console(force_terminal=True, width=400)
    with console.capture() as captured:
        console.print(room_for_trust(held))
    assert "x[/]y" in captured.get() and "[conceal]z" in captured.get()


@pytest.mark.parametrize("changed", ["copy_rules.json", "status_rules.json"])
def test_a_trust_table_is_bound_to_the_rules_its_world_model_was_measured_with(tmp_path, changed):
    """A folder whose copy or status rules changed after its report (added, removed, edited) is not the
    world model that was measured: its table earns nothing."""
    (tmp_path / changed).write_text('{"tools": {}}')
    _table(tmp_path, {"delete_todo": {"believe_failures": True, "fail_closed": True, **EARNED}})
    assert read_trust(tmp_path).tools["delete_todo"].believe_failures and not read_trust(tmp_path).notes
    (tmp_path / changed).write_text('{"tools": {}, "known": ["X"]}')
    table = read_trust(tmp_path)
    assert table.notes and "other weights" in table.notes[0] and not table.tools["delete_todo"].believe_failures
    (tmp_path / changed).unlink()
    assert read_trust(tmp_path).notes


def test_a_partial_or_ruled_rehearsal_fails_closed_where_an_unusable_one_did_and_vouches_for_nothing():
    """From outside: a result cut at the budget or off its schema (its status decided, its reply not read
    whole) ran a destructive call the gate had failed closed on while it was unreadable; and a status rule
    turned an unreadable rehearsal into a failure the table did not believe, which then ran."""
    from envace_mcp.policy.status_rules import StatusRule, StatusTable
    from envace_mcp.policy.types import RehearseRequest

    closed = {"delete_todo": ToolTrust(fail_closed=True, skip_approval=True)}
    cut = FINE.model_copy(update={"code": "CUT", "partial": True})
    for before, after in ((GARBLED, cut), (GARBLED, cut.model_copy(update={"code": "OFF_SCHEMA"}))):
        assert decide(CALL, DELETE, before, mode="real", config=gate(closed, on_unusable="block")).action == "block"
        assert decide(CALL, DELETE, after, mode="real", config=gate(closed, on_unusable="block")).action == "block"
    assert decide(CALL, DELETE, FINE, mode="real", config=gate(closed, require_approval="measured")).action == "execute"
    assert decide(CALL, DELETE, cut, mode="real", config=gate(closed, require_approval="measured")).action == "ask"
    rules = StatusTable({"delete_todo": ((DELETE.server, DELETE.behaviour), [StatusRule("unseen id", 9, 1.0)])})
    request = RehearseRequest(call=CALL, tool=DELETE)
    assert rules.apply(GARBLED, request) == GARBLED  # unusable stays unusable
    ruled = rules.apply(cut, request)
    assert (ruled.status, ruled.ruled, ruled.partial) == ("tool_error", "unseen id", True)
    assert decide(CALL, DELETE, ruled, mode="real", config=gate(closed, on_unusable="block")).action == "block"


def test_a_renamed_rules_file_or_changed_reply_budgets_are_another_world_model(tmp_path):
    """From outside: the digest joined the files' bytes with no names, so a status_rules.json renamed to
    copy_rules.json (its rules gone) kept the table believed; the reply budgets were not in it at all."""
    (tmp_path / "status_rules.json").write_text('{"tools": {}}')
    (tmp_path / "envace.json").write_text('{"reply_tokens": {"list_items": 429}}')
    _table(tmp_path, {"delete_todo": {"believe_failures": True, "fail_closed": True, **EARNED}})
    assert not read_trust(tmp_path).notes
    (tmp_path / "status_rules.json").rename(tmp_path / "copy_rules.json")
    assert read_trust(tmp_path).notes
    (tmp_path / "copy_rules.json").rename(tmp_path / "status_rules.json")
    assert not read_trust(tmp_path).notes
    (tmp_path / "envace.json").write_text('{"reply_tokens": {"list_items": 2000}}')
    assert read_trust(tmp_path).notes
