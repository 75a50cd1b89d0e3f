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


def d(call, spec, prediction=None, mode="real", real_calls=0, max_real_calls=None, **config):
    """The gate's rules apart from approval (opted out here; the default is checked on its own)."""
    config = {"require_approval": "never", **config}
    return decide(call, spec, prediction, mode=mode, config=GateConfig(**config), real_calls=real_calls,
                  max_real_calls=max_real_calls)


def test_by_default_every_destructive_call_waits_for_approval_and_reads_run():
    default = GateConfig()
    assert decide(OK, WRITE, FINE, mode="real", config=default).action == "ask"
    assert decide(OK, WRITE, None, mode="real", config=default).action == "ask"
    read = ToolCall(id="2", name="get_balance", arguments={})
    assert decide(read, READ, None, mode="real", config=default).action == "execute"


def test_an_unusable_rehearsal_is_never_reported_as_no_objection():
    garbled = Prediction(tool="transfer", status="invalid", code="OUTPUT_SCHEMA_MISMATCH")
    for config in (GateConfig(), GateConfig(require_approval="never")):
        decision = decide(OK, WRITE, garbled, mode="real", config=config)
        assert "no objection" not in decision.reason and "unusable (OUTPUT_SCHEMA_MISMATCH)" in decision.reason


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
    closed = d(OK, WRITE, garbled, on_unusable="block")
    assert closed.action == "block" and "unusable (OUTPUT_SCHEMA_MISMATCH)" in closed.reason
    assert d(OK, WRITE, garbled, on_unusable="block", approve_blocked=True).action == "ask"
    call = ToolCall(id="3", name="add_note", arguments={})  # not destructive: it runs, no feedback to give
    assert d(call, SAFE_WRITE, garbled, on_unusable="block").action == "execute"
    assert d(OK, WRITE, FINE, on_unusable="block").action == "execute"
    assert d(OK, WRITE, None, on_unusable="block").action == "execute"  # not rehearsed


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
    wanted = {"on_unusable": "block", "min_failure_confidence": 0.5, "rehearse": "all"}
    (tmp_path / "envace.json").write_text(json.dumps({"tool_format": "compact", "gate": wanted}))
    assert adapter_gate(tmp_path) == wanted
    config = GateConfig(**adapter_gate(tmp_path), require_approval="destructive")
    assert config.on_unusable == "block" and config.rehearse == "all"
    # an adapter saved before failing closed became one choice still reads, as the new shape
    (tmp_path / "envace.json").write_text(json.dumps({"gate": {"block_destructive_on_unusable_rehearsal": True}}))
    assert adapter_gate(tmp_path) == {"on_unusable": "block"}
    for bad, says in [({"require_approval": "never"}, "recommendation.*may set only"),  # approval stays the caller's
                      ({"max_real_calls": None}, "may set only"),
                      ({"evidence": ["repeated_writes"]}, "may set only"),  # the run's own evidence too
                      ({"on_unusable": "maybe"}, "on_unusable must be 'allow' or 'block', not 'maybe'"),
                      ({"min_failure_confidence": 2}, "must be less than or equal to 1, not 2"),
                      ({"rehearse": "some"}, "rehearse must be 'all', 'writes' or 'none'"),
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

    every = {"rehearse": "all", "approve_blocked": True, "min_failure_confidence": 0.5, "on_unusable": "block",
             "evidence": ["repeated_writes"], "require_approval": "destructive", "feedback_on_predicted_error": False}
    assert GateConfig(**gate_settings(every, "here")) == GateConfig(**every)
    for bad, says in [({"approve_blocked": "perhaps"}, "approve_blocked must be a valid boolean"),
                      ({"min_failure_confidence": float("nan")}, "min_failure_confidence must be"),
                      ({"require_approval": None}, "must be 'never', 'measured', 'destructive' or 'always', not None"),
                      ({"evidence": ["made_up"]}, "evidence must be 'repeated_failures', 'repeated_writes' or "),
                      ({"colour": "red"}, "here: unknown setting 'colour' (known: rehearse, "),
                      ({"evidance": []}, "unknown setting 'evidance'; did you mean 'evidence'?"),
                      ({"max_steps": 3}, "max_steps is not a gate setting: it is a run limit (RunLimits; --limits"),
                      ("max_steps=3", "must be an object")]:
        with pytest.raises(UserError, match=re.escape(says)):
            gate_settings(bad, "here")
    with pytest.raises(UserError, match="here: may set only rehearse, not 'approve_blocked'"):
        gate_settings({"approve_blocked": True}, "here", allowed=("rehearse",))


def test_settings_written_before_the_evidence_rules_became_one_set_read_as_the_new_shape():
    """Recorded runs, journals and adapters keep the old booleans; they map, and mean what they meant."""
    old = {"block_destructive_on_unusable_rehearsal": True, "block_repeated_writes": True,
           "block_ungrounded_arguments": True, "block_repeated_failures": False}
    assert GateConfig(**old) == GateConfig(on_unusable="block", evidence=("repeated_writes", "ungrounded_arguments"))
    assert GateConfig(block_destructive_on_unusable_rehearsal=False).on_unusable == "allow"
    assert GateConfig(evidence=["repeated_writes", "repeated_writes"]).evidence == ("repeated_writes",)


def test_key_value_text_is_typed_by_the_field_it_sets_and_run_limits_have_their_own_door():
    from envace_mcp.graph.gate import RunLimits, gate_text, limits_text

    assert gate_text("rehearse=all,approve_blocked=yes,min_failure_confidence=0.5,evidence=[repeated_writes,"
                     "ungrounded_arguments],on_unusable=block", "--gate") == {
        "rehearse": "all", "approve_blocked": True, "min_failure_confidence": 0.5, "on_unusable": "block",
        "evidence": ("repeated_writes", "ungrounded_arguments")}
    assert gate_text("evidence=[]", "--gate") == {"evidence": ()}
    assert limits_text("max_steps=8,max_real_calls=none", "--limits") == {"max_steps": 8, "max_real_calls": None}
    assert RunLimits(**limits_text("max_rehearsals=0", "x")) == RunLimits(max_rehearsals=0)
    for text, says in [("max_steps=3", "--gate: 'max_steps' is not a setting of GateConfig: it is a run limit "
                                       "(RunLimits; --limits max_steps=N, ENVACE_LIMITS)"),
                       ("rehearse", "--gate: 'rehearse' needs a value"),
                       ("rehearse=al", "--gate: rehearse must be 'all', 'writes' or 'none', not 'al'")]:
        with pytest.raises(UserError, match=re.escape(says)):
            gate_text(text, "--gate")
    for text, says in [("max_steps=0", "--limits: max_steps must be greater than or equal to 1, not '0'"),
                       ("max_steps=none", "--limits: max_steps must be a valid integer"),
                       ("max_real_calls=-1", "max_real_calls must be greater than or equal to 0"),
                       ("max_step=3", "unknown setting 'max_step'; did you mean 'max_steps'?")]:
        with pytest.raises(UserError, match=re.escape(says)):
            limits_text(text, "--limits")


def test_the_runs_evidence_is_what_the_user_wrote_and_what_ran_without_error():
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from envace_mcp.graph.gate import Evidence, call_key
    from envace_mcp.policy.prompts import GRAPH_NOTE, NOT_EXECUTED

    def ai(i, name, **args):
        return AIMessage(content="", tool_calls=[{"id": i, "name": name, "args": args}])

    messages = [HumanMessage(content="Move $5 from CHK-1 to SAV-2."),
                ai("a", "get_balance", account_id="CHK-1"),
                ToolMessage(content='{"account_id": "CHK-1", "owner": "Zo\\u00eb", "positions": ["BRK-15"]}', tool_call_id="a"),
                ai("b", "transfer", from_account_id="CHK-1", to_account_id="SAV-9", amount=5),
                ToolMessage(content="Unknown account 'SAV-9'", tool_call_id="b", status="error"),
                ai("c", "transfer", from_account_id="CHK-1", to_account_id="SAV-7", amount=5),
                ToolMessage(content="Not executed (block): SAV-7 ...", tool_call_id="c", status="error",
                            additional_kwargs={NOT_EXECUTED: "block"})]
    seen = Evidence.of(messages, {"get_balance": True, "transfer": False})
    assert [seen.grounded(v) for v in ("CHK-1", "SAV-2", "BRK-15", "Zoë", "chk-1", "ZOË")] == [True] * 6
    assert [seen.grounded(v) for v in ("SAV-9", "SAV-7", "BRK-1", "CHK")] == [False] * 4  # errors, refusals, parts
    assert seen.refused == {call_key("transfer", {"from_account_id": "CHK-1", "to_account_id": "SAV-9", "amount": 5})}
    wrote = messages + [ai("d", "transfer", from_account_id="CHK-1", to_account_id="SAV-2", amount=1),
                        ToolMessage(content='{"transfer_id": "T-1"}', tool_call_id="d")]
    assert Evidence.of(wrote, {"get_balance": True, "transfer": False}).refused == frozenset()  # a write ran: retry allowed
    read = messages + [ai("e", "get_balance", account_id="SAV-2"), ToolMessage(content="{}", tool_call_id="e")]
    assert Evidence.of(read, {"get_balance": True, "transfer": False}).refused == seen.refused  # a read changes nothing
    assert seen.done == frozenset()  # reads, errors and refusals are not writes that ran
    moved = call_key("transfer", {"from_account_id": "CHK-1", "to_account_id": "SAV-2", "amount": 1})
    assert Evidence.of(wrote, {"get_balance": True, "transfer": False}).done == {moved}
    note = HumanMessage(content="Your last message tried to call a tool but SAV-5 ...", additional_kwargs={GRAPH_NOTE: "format"})
    noted = Evidence.of(wrote + [note], {"get_balance": True, "transfer": False})
    assert noted.done == {moved} and not noted.grounded("SAV-5")  # the graph's note is not the user asking again
    again = Evidence.of(wrote + [HumanMessage(content="Send it once more.")], {"get_balance": True, "transfer": False})
    assert again.done == frozenset() and again.refused == frozenset()  # the user asked again: allowed


def test_the_evidence_rules_check_identifiers_of_destructive_calls_only_when_asked():
    from envace_mcp.graph.gate import Evidence, call_key

    schema = {"type": "object", "properties": {"account_id": {"type": "string"}, "side": {"enum": ["buy", "sell"]},
                                               "memo": {"type": "string"}, "ids": {"type": "array"}}}
    order = ToolSpec.create(remote_name="place_order", server="bank", description="", input_schema=schema,
                            output_schema=None, annotations=ToolAnnotations.from_hints({"destructiveHint": True}))
    seen = Evidence(text="Buy for BRK-1 please", refused=frozenset({call_key("place_order", {"account_id": "BRK-1"})}),
                    done=frozenset({call_key("place_order", {"account_id": "BRK-1", "side": "buy"})}))
    rules = {"evidence": ["ungrounded_arguments", "repeated_failures", "repeated_writes"]}

    def decide_(arguments, spec=order, **config):
        call = ToolCall(id="1", name=spec.name, arguments=arguments)
        return decide(call, spec, FINE, mode="real", config=GateConfig(**{"require_approval": "never", **config}), evidence=seen)

    assert decide_({"account_id": "BRK-1", "side": "sell", "memo": "for my niece"}, **rules).action == "execute"
    assert decide_({"account_id": "BRK-1"}, **rules).reason.endswith("no write has succeeded since")
    assert decide_({"account_id": "BRK-2"}, **rules).reason.endswith("'BRK-2' appears nowhere in the user's messages or in any tool's reply")
    assert decide_({"account_id": "BRK-1", "ids": ["BRK-1", "X-9"]}, **rules).reason.startswith("destructive call blocked: ids='X-9'")
    assert decide_({"account_id": "BRK-1", "side": "buy"}, **rules).reason.endswith("since the user's last message: it is done")
    assert decide_({"account_id": "BRK-1", "side": "sell"}, **rules).action == "execute"  # another write
    assert decide_({"account_id": "BRK-1", "side": "buy"}, evidence=["repeated_failures"]).action == "execute"  # each rule apart
    assert decide_({"account_id": "BRK-2"}).action == "execute"  # off by default
    assert decide_({"account_id": "BRK-2"}, approve_blocked=True, **rules).action == "ask"
    read = ToolSpec.create(remote_name="place_order", server="bank", description="", input_schema=schema,
                           output_schema=None, annotations=ToolAnnotations.from_hints({"readOnlyHint": True}))
    assert decide_({"account_id": "BRK-2"}, spec=read, **rules).action == "execute"  # reads are never blocked


def test_none_typed_on_a_command_line_is_the_word_a_choice_takes_and_none_where_a_field_may_be_none():
    """`--gate rehearse=none` was read as None and refused ("must be 'all', 'writes' or 'none', not None")."""
    from envace_mcp.graph.gate import gate_text, limits_text

    assert gate_text("rehearse=none", "--gate") == {"rehearse": "none"}
    assert limits_text("max_real_calls=none,max_rehearsals=null", "--limits") == {"max_real_calls": None,
                                                                                  "max_rehearsals": None}
