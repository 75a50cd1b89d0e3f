"""What a served graph's API caller may set: `loosened` (the gate only tightens) and `Deployment.from_env`."""

import pytest

from envace_mcp.errors import UserError
from envace_mcp.graph import GateConfig
from envace_mcp.graph.served import Deployment, loosened

DEPLOYED = GateConfig(require_approval="destructive", max_real_calls=10, min_failure_confidence=0.5)


@pytest.mark.parametrize("settings", [
    {"require_approval": "always"}, {"require_approval": "destructive"}, {"max_steps": 2}, {"max_real_calls": 0},
    {"min_failure_confidence": 0.0}, {"block_repeated_writes": True, "block_ungrounded_arguments": True},
    {"feedback_on_predicted_error": True}, {"max_rehearsals": 100},
])
def test_a_setting_at_least_as_strict_as_the_deployments_is_accepted(settings):
    assert loosened(DEPLOYED, settings) is None


@pytest.mark.parametrize("settings, says", [
    ({"require_approval": "never"},
     'require_approval="never" over the deployment\'s "destructive" asks a human about fewer calls'),
    ({"max_steps": 2, "max_real_calls": None}, "max_real_calls=null over the deployment's 10 raises a budget"),
    ({"max_steps": 13}, "max_steps=13 over the deployment's 12 raises a budget"),
    ({"min_failure_confidence": 0.9},
     "min_failure_confidence=0.9 over the deployment's 0.5 trusts fewer predicted failures"),
    ({"block_destructive_on_predicted_failure": False}, "stops fewer calls"),
    ({"feedback_on_predicted_error": False}, "stops fewer calls"),
    ({"approve_blocked": True}, "lets a human run calls the gate blocks"),
    ({"max_rehearsals": 5}, "changes the rehearsal budget"),  # fewer leave writes unrehearsed: not tighter
    ({"rehearse": "none"}, "rehearses fewer calls"),
    ({"rehearse": "all"}, "spends the rehearsal budget on reads"),  # under a budget, writes may go unrehearsed
])
def test_a_looser_setting_is_named_with_why(settings, says):
    assert says in loosened(DEPLOYED, settings)


def test_rehearsing_more_is_tighter_only_where_no_budget_is_shared_and_blocked_calls_stay_blocked():
    assert loosened(GateConfig(rehearse="none"), {"rehearse": "all"}) is None
    assert loosened(GateConfig(max_rehearsals=None), {"rehearse": "all"}) is None
    # with approve_blocked on, what blocks more sends calls that feedback stopped to a human instead
    routed = GateConfig(approve_blocked=True)
    assert "approve_blocked is on" in loosened(routed, {"block_repeated_writes": True})
    assert loosened(routed, {"block_repeated_writes": True, "approve_blocked": False}) is None


def test_the_deployment_reads_its_gate_as_json_or_as_key_value_pairs_and_names_a_bad_variable():
    assert Deployment.from_env({}) == Deployment()
    kv = Deployment.from_env({"ENVACE_GATE": "require_approval=always,max_real_calls=none,block_repeated_writes=true",
                              "ENVACE_ALLOW_CONTEXT": "servers, gate", "ENVACE_SERVERS": "mcp.json"})
    assert kv.gate == {"require_approval": "always", "max_real_calls": None, "block_repeated_writes": True}
    assert kv.allow == {"servers", "gate"} and kv.servers == "mcp.json"
    assert Deployment.from_env({"ENVACE_GATE": '{"max_steps": 3}'}).gate == {"max_steps": 3}
    for env, says in [({"ENVACE_GATE": "max_steps=0"}, "ENVACE_GATE: max_steps must be a whole number"),
                      ({"ENVACE_GATE": "{bad"}, "ENVACE_GATE: not a JSON object"),
                      ({"ENVACE_GATE": "colour=red"}, "ENVACE_GATE: unknown setting 'colour'"),
                      ({"ENVACE_ALLOW_CONTEXT": "policy"}, "ENVACE_ALLOW_CONTEXT: unknown policy; known: servers"),
                      ({"ENVACE_MODE": "live"}, "ENVACE_MODE must be one of real, simulated, mixed")]:
        with pytest.raises(UserError, match=says):
            Deployment.from_env(env)
