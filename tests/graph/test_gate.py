"""Every gate path, as pure functions."""

import json
import re

import pytest

from envace_mcp.errors import UserError
from envace_mcp.graph.gate import GateConfig, decide, should_rehearse
from envace_mcp.policy import Prediction, ToolCall
from envace_mcp.toolbox import ToolAnnotations, ToolSpec

SCHEMA = {"type": "object", "properties": {"amount": {"type": "number", "exclusiveMinimum": 0}}, "required": ["amount"]}
READ = ToolSpec.create(remote_name="get_balance", server="bank", description="", input_schema={"type": "object"},
                       output_schema=None, annotations=ToolAnnotations.from_hints({"readOnlyHint": True}))
WRITE = ToolSpec.create(remote_name="transfer", server="bank", description="", input_schema=SCHEMA, output_schema=None,
                        annotations=ToolAnnotations.from_hints({"destructiveHint": True}))
SAFE_WRITE = ToolSpec.create(remote_name="add_note", server="crm", description="", input_schema={"type": "object"},
                             output_schema=None, annotations=ToolAnnotations.from_hints({"destructiveHint": False}))
OK = ToolCall(id="1", name="transfer", arguments={"amount": 5})
FAILS = Prediction(tool="transfer", status="tool_error", code="EXECUTION_ERROR", message="Insufficient funds")
FINE = Prediction(tool="transfer", status="result", result={"ok": True})


def d(call, spec, prediction=None, mode="real", real_calls=0, **config):
    return decide(call, spec, prediction, mode=mode, config=GateConfig(**config), real_calls=real_calls)


@pytest.mark.parametrize(
    ("spec", "mode", "rehearse", "expected"),
    [(READ, "real", "writes", False), (WRITE, "real", "writes", True), (READ, "real", "all", True),
     (WRITE, "real", "none", False), (READ, "simulated", "none", True), (READ, "mixed", "writes", False),
     (WRITE, "mixed", "none", True), (None, "real", "all", False)],
)
def test_which_calls_are_rehearsed(spec, mode, rehearse, expected):
    assert should_rehearse(spec, mode, GateConfig(rehearse=rehearse)) is expected


def test_unknown_tools_and_invalid_arguments_are_rejected_before_anything_else():
    assert d(ToolCall(id="1", name="nope"), None).action == "reject"
    bad = d(ToolCall(id="1", name="transfer", arguments={"amount": -1}), WRITE, mode="simulated")
    assert bad.action == "reject" and "field 'amount'" in bad.reason


def test_simulated_and_mixed_modes_answer_with_the_rehearsal():
    assert d(OK, WRITE, FINE, mode="simulated").action == "simulate"
    assert d(OK, WRITE, FAILS, mode="mixed").action == "simulate"
    read = ToolCall(id="2", name="get_balance", arguments={})
    assert d(read, READ, None, mode="mixed").action == "execute"


def test_predicted_failure_of_a_destructive_call_blocks_it_unless_a_human_may_approve():
    blocked = d(OK, WRITE, FAILS)
    assert blocked.action == "block" and "Insufficient funds" in blocked.reason
    assert d(OK, WRITE, FAILS, approve_blocked=True).action == "ask"
    assert d(OK, WRITE, FAILS, block_destructive_on_predicted_failure=False).action == "feedback"
    assert d(OK, WRITE, FAILS, block_destructive_on_predicted_failure=False,
             feedback_on_predicted_error=False).action == "execute"


def test_a_predicted_error_on_a_non_destructive_tool_goes_back_as_feedback():
    call = ToolCall(id="3", name="add_note", arguments={})
    assert d(call, SAFE_WRITE, FAILS).action == "feedback"


def test_budgets_and_approval_rules():
    assert d(OK, WRITE, FINE, real_calls=3, max_real_calls=3).action == "budget"
    assert d(OK, WRITE, FINE, require_approval="destructive").action == "ask"
    read = ToolCall(id="2", name="get_balance", arguments={})
    assert d(read, READ, None, require_approval="destructive").action == "execute"
    assert d(read, READ, None, require_approval="always").action == "ask"
    assert d(OK, WRITE, FINE).action == "execute"


def test_an_invalid_rehearsal_stops_a_destructive_call_only_when_the_gate_fails_closed():
    garbled = Prediction(tool="transfer", status="invalid", code="OUTPUT_SCHEMA_MISMATCH")
    assert d(OK, WRITE, garbled).action == "execute"  # by default
    closed = d(OK, WRITE, garbled, block_destructive_on_unusable_rehearsal=True)
    assert closed.action == "block" and "unusable (OUTPUT_SCHEMA_MISMATCH)" in closed.reason
    assert d(OK, WRITE, garbled, block_destructive_on_unusable_rehearsal=True, approve_blocked=True).action == "ask"
    call = ToolCall(id="3", name="add_note", arguments={})  # not destructive: it runs, no feedback to give
    assert d(call, SAFE_WRITE, garbled, block_destructive_on_unusable_rehearsal=True).action == "execute"
    assert d(OK, WRITE, FINE, block_destructive_on_unusable_rehearsal=True).action == "execute"
    assert d(OK, WRITE, None, block_destructive_on_unusable_rehearsal=True).action == "execute"  # not rehearsed


def test_a_predicted_failure_stops_a_call_only_when_the_rehearsal_was_sure_enough_of_it():
    unsure = FAILS.model_copy(update={"confidence": 0.6})
    assert d(OK, WRITE, unsure).action == "block"  # by default every predicted failure counts
    assert d(OK, WRITE, unsure, min_failure_confidence=0.5).action == "block"
    assert d(OK, WRITE, unsure, min_failure_confidence=0.8).action == "execute"
    assert d(OK, WRITE, unsure, min_failure_confidence=0.8, require_approval="destructive").action == "ask"
    call = ToolCall(id="3", name="add_note", arguments={})
    assert d(call, SAFE_WRITE, unsure, min_failure_confidence=0.8).action == "execute"  # no feedback either
    assert d(call, SAFE_WRITE, unsure, min_failure_confidence=0.6).action == "feedback"
    assert d(OK, WRITE, FAILS, min_failure_confidence=0.99).action == "block"  # no confidence reported: sure


def test_an_adapter_recommends_how_far_to_trust_its_world_model_and_nothing_else(tmp_path):
    from envace_mcp.graph import adapter_gate

    assert adapter_gate(None) == {} and adapter_gate(tmp_path) == {}  # no envace.json: no recommendation
    (tmp_path / "envace.json").write_text(json.dumps({"tool_format": "compact"}))
    assert adapter_gate(tmp_path) == {}
    wanted = {"block_destructive_on_unusable_rehearsal": True, "min_failure_confidence": 0.5, "rehearse": "all"}
    (tmp_path / "envace.json").write_text(json.dumps({"tool_format": "compact", "gate": wanted}))
    assert adapter_gate(tmp_path) == wanted
    config = GateConfig(**adapter_gate(tmp_path), require_approval="destructive")
    assert config.block_destructive_on_unusable_rehearsal and config.rehearse == "all"
    for bad, says in [({"require_approval": "never"}, "recommendation.*may set only"),  # approval stays the caller's
                      ({"max_real_calls": None}, "may set only"),
                      ({"block_destructive_on_unusable_rehearsal": "yes"}, "must be true or false"),
                      ({"min_failure_confidence": 2}, "must be a number from 0 to 1, not 2"),
                      ({"min_failure_confidence": True}, "must be a number from 0 to 1"),
                      ({"rehearse": "some"}, "rehearse must be one of all, writes, none"),
                      (["rehearse"], "must be an object")]:
        (tmp_path / "envace.json").write_text(json.dumps({"gate": bad}))
        with pytest.raises(UserError, match=says):
            adapter_gate(tmp_path)
    (tmp_path / "envace.json").write_text("{torn")
    with pytest.raises(UserError, match="not JSON"):
        adapter_gate(tmp_path)


def test_gate_settings_take_what_json_gives_and_a_bad_one_says_what_its_field_takes():
    """One check for the three ways settings arrive as data: `--gate`, a served graph's JSON, envace.json."""
    from envace_mcp.graph.gate import gate_settings

    every = {"rehearse": "all", "approve_blocked": True, "min_failure_confidence": 0.5, "max_real_calls": None,
             "max_rehearsals": 0, "max_steps": 1, "require_approval": "destructive", "feedback_on_predicted_error": False}
    assert GateConfig(**gate_settings(every, "here")) == GateConfig(**every)
    for bad, says in [({"max_steps": 0}, "here: max_steps must be a whole number of at least 1, not 0"),
                      ({"max_steps": 2.0}, "max_steps must be a whole number"),
                      ({"max_steps": None}, "at least 1, not None"),  # only the budgets may be unlimited
                      ({"max_real_calls": -1}, "max_real_calls must be a whole number of at least 0 or null"),
                      ({"approve_blocked": 1}, "approve_blocked must be true or false, not 1"),
                      ({"min_failure_confidence": float("nan")}, "must be a number from 0 to 1"),
                      ({"require_approval": None}, "must be one of never, destructive, always"),
                      ({"colour": "red"}, "here: unknown setting 'colour'; known: rehearse, "),
                      ("max_steps=3", "must be an object")]:
        with pytest.raises(UserError, match=re.escape(says)):
            gate_settings(bad, "here")
    with pytest.raises(UserError, match="here: may set only rehearse, not 'max_steps'"):
        gate_settings({"max_steps": 3}, "here", allowed=("rehearse",))
