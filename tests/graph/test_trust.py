"""The trust table: the gate acts on a world model's predictions only for the tools it was measured on."""

import json

import pytest

from envace_mcp.errors import UserError
from envace_mcp.graph import EnvaceContext, GateConfig, ToolTrust, gate_for, read_trust
from envace_mcp.graph.gate import decide
from envace_mcp.graph.served import loosened
from envace_mcp.policy import Prediction, ToolCall
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
    measured_elsewhere = {"transfer_funds": ToolTrust(stop=True)}
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
    trusted = decide(CALL, DELETE, FAILS, mode="real", config=gate({"delete_todo": ToolTrust(stop=True)}))
    assert trusted.action == "block"
    unreliable = decide(CALL, DELETE, FAILS, mode="real", config=gate({"delete_todo": ToolTrust(stop=False)}))
    assert unreliable.action == "execute" and "not measured reliable" in unreliable.reason
    feedback = decide(ToolCall(id="2", name="add_note"), NOTE, FAILS.model_copy(update={"tool": "add_note"}),
                      mode="real", config=gate({"add_note": ToolTrust(stop=True)}))
    assert feedback.action == "feedback"


def test_a_predicted_success_skips_approval_only_where_the_caller_asks_for_measured_approval():
    table = {"delete_todo": ToolTrust(stop=True, skip_approval=True)}
    assert decide(CALL, DELETE, FINE, mode="real", config=gate(table, require_approval="destructive")).action == "ask"
    measured = decide(CALL, DELETE, FINE, mode="real", config=gate(table, require_approval="measured"))
    assert measured.action == "execute" and "measured reliable" in measured.reason
    for prediction in (FAILS, GARBLED, None):  # nothing vouched for: asked (or blocked)
        assert decide(CALL, DELETE, prediction, mode="real",
                      config=gate(table, require_approval="measured")).action in ("ask", "block")
    unearned = {"delete_todo": ToolTrust(stop=True)}
    assert decide(CALL, DELETE, FINE, mode="real", config=gate(unearned, require_approval="measured")).action == "ask"


class _Policy:
    def __init__(self, folder):
        self.adapter_folder = folder


def test_gates_take_the_world_models_table_from_its_folder_wherever_they_are_resolved(tmp_path):
    (tmp_path / "trust.json").write_text(json.dumps({"tools": {"delete_todo": {"stop": True, "calls": 40}},
                                                      "measured_on": {}}))
    assert read_trust(tmp_path) == {"delete_todo": ToolTrust(stop=True)}
    policy = _Policy(tmp_path)
    assert gate_for(policy).trust == {"delete_todo": ToolTrust(stop=True)}
    given = gate_for(policy, GateConfig(require_approval="never"))  # a gate of the caller's own keeps the table
    assert given.trust == {"delete_todo": ToolTrust(stop=True)} and given.require_approval == "never"
    assert EnvaceContext(policy=policy).gate.trust == {"delete_todo": ToolTrust(stop=True)}
    assert gate_for(_Policy(None)).trust is None


@pytest.mark.parametrize("text", ["{torn", '{"tools": []}', '{"tools": {"x": {"stop": "perhaps"}}}'])
def test_a_torn_trust_table_is_one_error_naming_it(tmp_path, text):
    (tmp_path / "trust.json").write_text(text)
    with pytest.raises(UserError, match=r"trust\.json: not a trust table"):
        read_trust(tmp_path)


def test_a_served_caller_cannot_replace_the_deployments_trust_table():
    deployed = GateConfig(trust={"delete_todo": ToolTrust(stop=True)})
    assert "trust table" in loosened(deployed, {"trust": {"delete_todo": {"stop": True, "skip_approval": True}}})
    assert "fewer calls" in loosened(GateConfig(), {"require_approval": "measured"})


def test_the_shipped_world_model_is_trusted_on_the_bundled_tools_and_nowhere_else():
    """Its gate was measured on bank and retail (docs/evidence.md): a user's own delete is asked about with
    the prediction shown, no longer blocked because its rehearsal could not be read."""
    from envace_mcp.policy.embedded import embedded_adapter

    shipped = gate_for(_Policy(embedded_adapter()), GateConfig(require_approval="never", on_unusable="block"))
    assert shipped.trust["transfer"].stop and shipped.trust["return_items"].stop
    assert not any(t.skip_approval for t in shipped.trust.values())
    assert decide(CALL, DELETE, GARBLED, mode="real", config=shipped).action == "execute"
    transfer = ToolSpec.create(remote_name="transfer", server="bank", description="", input_schema={"type": "object"},
                               output_schema=None, annotations=ToolAnnotations.from_hints({"destructiveHint": True}))
    assert decide(ToolCall(id="2", name="transfer", arguments={}), transfer, GARBLED, mode="real",
                  config=shipped).action == "block"


def test_a_world_model_folder_without_a_report_is_refused_in_one_line(tmp_path):
    from envace_mcp.policy.roles import with_world_model

    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(UserError, match="has no report \\(trust.json\\): measure it first, envace world-model report"):
        with_world_model(_Policy(None), tmp_path)
    with pytest.raises(UserError, match="no adapter there"):
        with_world_model(_Policy(None), tmp_path / "missing")
