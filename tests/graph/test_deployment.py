"""What a served graph's API caller may set: `loosened` (the gate and the limits only tighten) and
`Deployment.from_env`."""

import pytest

from envace_mcp.errors import UserError
from envace_mcp.graph import GateConfig, RunLimits
from envace_mcp.graph.served import Deployment, limits_loosened, loosened

DEPLOYED = GateConfig(require_approval="destructive", min_failure_confidence=0.5, on_unusable="block",
                      evidence=("repeated_writes",))
LIMITS = RunLimits(max_real_calls=10)


@pytest.mark.parametrize("settings", [
    {"require_approval": "always"}, {"require_approval": "destructive"},
    {"min_failure_confidence": 0.0}, {"evidence": ["repeated_writes", "ungrounded_arguments"]},
    {"feedback_on_predicted_error": True}, {"on_unusable": "block"},
])
def test_a_gate_setting_at_least_as_strict_as_the_deployments_is_accepted(settings):
    assert loosened(DEPLOYED, settings) is None


@pytest.mark.parametrize("settings, says", [
    ({"require_approval": "never"},
     'require_approval="never" over the deployment\'s "destructive" asks a human about fewer calls'),
    ({"min_failure_confidence": 0.9},
     "min_failure_confidence=0.9 over the deployment's 0.5 trusts fewer predicted failures"),
    ({"block_destructive_on_predicted_failure": False}, "stops fewer calls"),
    ({"feedback_on_predicted_error": False}, "stops fewer calls"),
    ({"on_unusable": "allow"}, "runs calls whose rehearsal could not be read"),
    ({"evidence": ["ungrounded_arguments"]}, "drops the evidence rule repeated_writes"),
    ({"approve_blocked": True}, "lets a human run calls the gate blocks"),
    ({"rehearse": "none"}, "rehearses fewer calls"),
    ({"rehearse": "all"}, "spends the rehearsal budget on reads"),  # under a budget, writes may go unrehearsed
])
def test_a_looser_gate_setting_is_named_with_why(settings, says):
    assert says in loosened(DEPLOYED, settings)


@pytest.mark.parametrize("settings, says", [
    ({"max_steps": 2}, None), ({"max_real_calls": 0}, None), ({"max_rehearsals": 100}, None),
    ({"max_steps": 2, "max_real_calls": None}, "max_real_calls=null over the deployment's 10 raises a budget"),
    ({"max_steps": 13}, "max_steps=13 over the deployment's 12 raises a budget"),
    ({"max_rehearsals": 5}, "changes the rehearsal budget"),  # fewer leave writes unrehearsed: not tighter
])
def test_run_limits_only_tighten_and_a_looser_one_is_named(settings, says):
    why = limits_loosened(LIMITS, settings)
    assert why is None if says is None else says in why


def test_rehearsing_more_is_tighter_only_where_no_budget_is_shared_and_blocked_calls_stay_blocked():
    assert loosened(GateConfig(rehearse="none"), {"rehearse": "all"}) is None
    assert loosened(GateConfig(), {"rehearse": "all"}, limits=RunLimits(max_rehearsals=None)) is None
    # with approve_blocked on, what blocks more sends calls that feedback stopped to a human instead
    routed = GateConfig(approve_blocked=True)
    assert "approve_blocked is on" in loosened(routed, {"evidence": ["repeated_writes"]})
    assert loosened(routed, {"evidence": ["repeated_writes"], "approve_blocked": False}) is None


def test_the_deployment_reads_its_gate_and_limits_as_json_or_as_key_value_pairs_and_names_a_bad_variable():
    assert Deployment.from_env({}) == Deployment()
    kv = Deployment.from_env({"ENVACE_GATE": "require_approval=always,evidence=[repeated_writes]",
                              "ENVACE_LIMITS": "max_real_calls=none,max_steps=6",
                              "ENVACE_ALLOW_CONTEXT": "servers, gate", "ENVACE_SERVERS": "mcp.json"})
    assert kv.gate == {"require_approval": "always", "evidence": ("repeated_writes",)}
    assert kv.limits == {"max_real_calls": None, "max_steps": 6}
    assert kv.allow == {"servers", "gate"} and kv.servers == "mcp.json"
    assert Deployment.from_env({"ENVACE_LIMITS": '{"max_steps": 3}'}).limits == {"max_steps": 3}
    # a deployment configured before the evidence rules became one set reads as the new shape
    assert Deployment.from_env({"ENVACE_GATE": "block_repeated_writes=true"}).gate == {"evidence": ("repeated_writes",)}
    for env, says in [({"ENVACE_LIMITS": "max_steps=0"}, "ENVACE_LIMITS: max_steps must be greater than or equal to 1"),
                      ({"ENVACE_GATE": "max_steps=3"}, "ENVACE_GATE: 'max_steps' is not a setting of GateConfig: it is a run limit"),
                      ({"ENVACE_GATE": "{bad"}, "ENVACE_GATE: not a JSON object"),
                      ({"ENVACE_GATE": "colour=red"}, "ENVACE_GATE: unknown setting 'colour'"),
                      ({"ENVACE_ALLOW_CONTEXT": "policy"}, "ENVACE_ALLOW_CONTEXT: unknown policy; known: servers"),
                      ({"ENVACE_MODE": "live"}, "ENVACE_MODE must be one of real, simulated, mixed")]:
        with pytest.raises(UserError, match=says):
            Deployment.from_env(env)
