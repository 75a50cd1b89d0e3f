"""`envace eval` measures what ships unless told otherwise, and resumes only the configuration it started."""

import json
import re

import pytest

from envace_mcp.errors import UserError
from envace_mcp.eval.evaluate import EvalConfig, _settings_key, finished_runs
from envace_mcp.graph import GateConfig, RunLimits, policy_gate
from envace_mcp.policy.adapter import Adapter
from envace_mcp.policy.embedded import embedded_adapter
from envace_mcp.policy.types import REHEARSE_MAX_NEW_TOKENS, run_sampling


def test_by_default_eval_measures_the_shipped_adapter_under_the_gate_it_recommends():
    """Before, eval ran the bare model under GateConfig() with the act role's budget for rehearsals, while
    demo, run and the served graph started from the adapter's recommendation (fail closed)."""
    config = EvalConfig(suite="bank")
    assert config.adapter_folder() == str(embedded_adapter())
    assert config.gate_config() == GateConfig(on_unusable="block", require_approval="never")  # unattended sandbox
    assert config.rehearse_max_new_tokens == REHEARSE_MAX_NEW_TOKENS == 400
    assert run_sampling()["rehearse"].max_new_tokens == config.rehearse_max_new_tokens  # as every run starts


def test_what_a_run_in_python_starts_from_is_what_eval_measures():
    class Shipped:  # a policy loaded with the shipped adapter carries its folder, read once
        adapter = Adapter.read(embedded_adapter())

    assert policy_gate(Shipped()).model_copy(update={"require_approval": "never"}) == EvalConfig(suite="bank").gate_config()
    assert EvalConfig(suite="bank", adapter="none").gate_config() == GateConfig(require_approval="never")
    assert EvalConfig(suite="bank", policy="noop").adapter_folder() is None


def test_settings_given_as_text_override_and_a_bad_one_says_what_it_takes():
    changed = EvalConfig(suite="bank").overridden("gate.on_unusable=allow,limits.max_steps=6,rehearse_max_new_tokens=200")
    assert changed.gate == {"on_unusable": "allow"} and changed.limits == RunLimits(max_steps=6)
    assert changed.gate_config().on_unusable == "allow" and changed.rehearse_max_new_tokens == 200
    for text, says in [("limits.max_step=3", "unknown setting 'max_step'; did you mean 'max_steps'?"),
                       ("gate.max_steps=3", "it is a run limit"),
                       ("tasks=[bank/test/0001]", "tasks cannot differ")]:
        with pytest.raises(UserError, match=says):
            EvalConfig(suite="bank").overridden(text).gate_config()


def test_a_folder_resumes_only_the_configuration_it_started_with_and_says_what_changed(tmp_path):
    first = EvalConfig(suite="bank", policy="noop", limit=2)
    (tmp_path / "runs.jsonl").write_text(json.dumps({"settings": _settings_key(first)}) + "\n")
    assert finished_runs(tmp_path, first.model_copy(update={"limit": 4, "concurrency": 2})) == {}  # selection may grow
    for changed, says in [({"limits": RunLimits(max_steps=3)}, "limits.max_steps: 12 → 3"),
                          ({"gate": {"evidence": ["repeated_writes"]}}, 'gate.evidence: null → ["repeated_writes"]'),
                          ({"rehearse_max_new_tokens": 160}, "rehearse_max_new_tokens: 400 → 160")]:
        with pytest.raises(UserError, match=f"holds runs of another configuration \\({re.escape(says)}"):
            finished_runs(tmp_path, first.model_copy(update=changed))
