"""Rewards without a checker (`envace_mcp.train.rewards`), on runs recorded against the bank server in
process: what the servers said (`outcomes`), what the person said (`approvals`), their weighted mean, the
edits kept as preference pairs, and `envace train grpo --reward` scoring a trace folder as users run it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from envace_mcp.envs import Episode, get_suite
from envace_mcp.errors import UserError
from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import TraceStore, record_run
from envace_mcp.train.rewards import approvals, combined, outcomes, preference_pairs, reward_from, score_missing

pytestmark = pytest.mark.anyio
FIXTURES = Path(__file__).parent.parent / "fixtures" / "traces"


@pytest.fixture
def bank():
    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "savings_minimum")
    me = task.initial_state["customer_id"]
    accounts = {a["type"]: a["id"] for a in task.initial_state["accounts"].values() if a["owner"] == me}
    return suite, task, accounts


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def receipt(transfer: dict[str, Any]) -> str:
    body = {"transfer_id": "T-1", **transfer, "from_balance": 0, "to_balance": 0}
    return f"<execution_result>{json.dumps(body)}</execution_result>"


FAILS = ('<execution_result>{"error_tool_call": {"code": "INSUFFICIENT_FUNDS", '
         '"message": "not enough money"}}</execution_result>')


async def record(bank, policy, *, approve=None, gate=None, timeout=None, store=None, checkpointer=None):
    suite, task, _ = bank
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}, **({"timeout": timeout} if timeout else {})) as toolbox:
        graph = create_envace_graph().compile(checkpointer=checkpointer)
        _, trace = await record_run(graph, {"messages": [HumanMessage(content=task.instruction)]},
                                    config={"configurable": {"thread_id": "t"}} if checkpointer else None,
                                    context=EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta),
                                                          approve=approve, **({"gate": gate} if gate else {})),
                                    store=store, group_id="g")
    return trace


def transfer(accounts, amount):
    return {"from_account_id": accounts["checking"], "to_account_id": accounts["savings"], "amount": amount}


async def reviewed(bank, store=None):
    """A person approves one transfer, denies one and edits one (5 → 2); a read of an account that does
    not exist errors on the server; the agent answers."""
    _, _, accounts = bank
    one, three, five = (transfer(accounts, a) for a in (1.0, 3.0, 5.0))
    answers = iter([True, {"type": "reject", "message": "not that much"},
                    {"type": "edit", "edited_action": {"name": "transfer", "args": transfer(accounts, 2.0)}}])
    policy = ScriptedPolicy(act=[call("transfer", **one), call("transfer", **three), call("transfer", **five),
                                 call("get_balance", account_id="CHK-404"), "Done."],
                            rehearse=[receipt(one), receipt(three), receipt(five)])
    trace = await record(bank, policy, approve=lambda request: next(answers), store=store)
    policy.assert_complete()
    return trace


async def stalled(bank, store=None):
    """The gate blocks the same transfer (rehearsed to fail) three times, and the run stalls."""
    _, _, accounts = bank
    policy = ScriptedPolicy(act=[call("transfer", **transfer(accounts, 1e9))] * 3, rehearse=[FAILS] * 3)
    return await record(bank, policy, store=store)


async def unattended(bank, store=None):
    """Nobody is asked (`require_approval="never"`): one transfer runs, the agent answers."""
    _, _, accounts = bank
    policy = ScriptedPolicy(act=[call("transfer", **transfer(accounts, 1.0)), "Moved $1."],
                            rehearse=[receipt(transfer(accounts, 1.0))])
    return await record(bank, policy, gate=GateConfig(require_approval="never"), store=store)


async def test_outcomes_counts_the_server_error_and_leaves_the_persons_refusal_to_approvals(bank):
    trace = await reviewed(bank)
    value, details = outcomes(trace)
    # judged: the approved transfer and the edited one ran fine, the read errored on the server
    assert details == {"answered": True, "calls": 3, "ok": 2, "server_errors": 1, "refused": {}, "stopped": {},
                       "repeated": 0, "stalled": False, "simulated": 0, "refused_by_person": 1}
    assert value == pytest.approx(0.5 + 0.5 * 2 / 3)


async def test_a_run_the_gate_stopped_until_it_stalled_scores_zero_and_says_why(bank):
    trace = await stalled(bank)
    value, details = outcomes(trace)
    assert value == 0.0
    assert details["stopped"] == {"block": 3} and details["repeated"] == 2 and details["ok"] == 0
    assert details["stalled"] is True and not details["answered"]
    assert details["stop_reason"].startswith("stopped: the agent proposed transfer")


async def test_calls_the_toolbox_refused_count_by_their_kind(bank):
    _, _, accounts = bank
    policy = ScriptedPolicy(act=[call("get_balance", account_id=accounts["checking"]), "I could not check it."])
    trace = await record(bank, policy, timeout=1e-9)  # every call runs past a 1 ns timeout
    value, details = outcomes(trace)
    assert details["refused"] == {"timeout": 1} and details["server_errors"] == 0 and details["calls"] == 1
    assert value == 0.5  # answered, and no call went through


async def test_approvals_labels_each_decision_and_scores_the_fraction_approved_as_proposed(bank):
    trace = await reviewed(bank)
    value, details = approvals(trace)
    assert value == pytest.approx(1 / 3)
    assert [(d["tool"], d["label"]) for d in details["labels"]] == [
        ("transfer", "approved"), ("transfer", "denied"), ("transfer", "edited")]
    assert (details["approved"], details["denied"], details["edited"]) == (1, 1, 1)


async def test_a_run_nobody_reviewed_cannot_be_scored_by_approvals(bank):
    for trace in (await unattended(bank), await stalled(bank)):
        value, details = approvals(trace)
        assert value is None and "no call of this run" in details["unscorable"]
    assert outcomes(await unattended(bank))[0] == 1.0


async def test_an_edit_is_kept_as_a_preference_pair_with_the_act_turn_that_proposed_it(bank):
    trace = await reviewed(bank)
    (pair,) = preference_pairs(trace)
    _, _, accounts = bank
    assert pair.chosen == {"name": "transfer", "arguments": transfer(accounts, 2.0)}
    assert pair.rejected == {"name": "transfer", "arguments": transfer(accounts, 5.0)}
    proposing = [s for s in trace.steps_of("act") if s.parsed["tool_calls"]
                 and s.parsed["tool_calls"][0]["arguments"] == transfer(accounts, 5.0)]
    assert len(proposing) == 1 and pair.completion_text == proposing[0].text and '"amount": 5.0' in pair.completion_text
    assert pair.call_id == proposing[0].parsed["tool_calls"][0]["id"] and pair.prompt_text == proposing[0].prompt_text
    assert preference_pairs(await unattended(bank)) == []


async def test_the_combination_is_the_weighted_mean_of_the_parts_that_could_score(bank):
    reward = combined({"outcomes": 1.0, "approvals": 2.0})
    assert reward.name == "outcomes+approvals*2"
    value, details = reward(await reviewed(bank))
    assert value == pytest.approx((1 * (0.5 + 0.5 * 2 / 3) + 2 * (1 / 3)) / 3)
    assert details["parts"]["approvals"]["value"] == pytest.approx(1 / 3)
    assert details["parts"]["approvals"]["weight"] == 2
    run = await unattended(bank)
    value, details = reward(run)
    assert value == 1.0 and details["parts"]["approvals"]["value"] is None  # skipped, not counted as 0
    assert details["parts"]["outcomes"] == {"value": 1.0, "weight": 1.0, "details": outcomes(run)[1]}


async def test_a_run_paused_for_approval_is_scored_by_neither_part(bank):
    _, _, accounts = bank
    one = transfer(accounts, 1.0)
    policy = ScriptedPolicy(act=[call("transfer", **one)], rehearse=[receipt(one)])
    trace = await record(bank, policy, checkpointer=InMemorySaver())  # nobody to answer: interrupt()
    assert trace.status == "interrupted"
    assert outcomes(trace)[0] is None and approvals(trace)[0] is None
    assert combined({"outcomes": 1, "approvals": 1})(trace)[0] is None


def test_reward_names_and_weights_are_read_and_checked():
    assert reward_from("outcomes") is outcomes and reward_from("approvals=3") is approvals
    assert reward_from("outcomes, approvals").name == "outcomes+approvals"
    assert reward_from("outcomes=0.5,approvals=2").weights == (("outcomes", 0.5), ("approvals", 2.0))
    with pytest.raises(UserError, match="reward task: choose from outcomes, approvals"):
        reward_from("outcomes,task")
    with pytest.raises(UserError, match="must be a number"):
        reward_from("outcomes=lots")
    with pytest.raises(UserError, match="positive"):
        reward_from("outcomes=1,approvals=0")


async def test_runs_are_scored_once_and_the_reward_is_read_back_with_the_run(bank, tmp_path):
    store = TraceStore(tmp_path / "runs")
    await reviewed(bank, store)
    await stalled(bank, store)
    reward = combined({"outcomes": 1, "approvals": 2})
    added = score_missing(list(store.read()), reward, store)
    assert [r.name for r in added] == ["outcomes+approvals*2"] * 2
    runs = list(store.read())
    assert [r.reward("outcomes+approvals*2").value for r in runs] == [pytest.approx(0.5), 0.0]
    assert score_missing(runs, reward, store) == []  # each has one now
    assert sum(len(r.rewards) for r in store.read()) == 2


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envace_mcp.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "200"})


def test_train_grpo_scores_the_runs_that_lack_the_reward_saves_it_and_trains_on_it(tmp_path, tiny_qwen3_dir):
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES, runs)  # four grouped runs with tokens and logprobs, scored by a checker ("task")
    config = tmp_path / "grpo.json"
    config.write_text(json.dumps({"model": str(tiny_qwen3_dir), "steps": 1, "groups_per_step": 1}))
    done = cli("train", "grpo", "--traces", str(runs), "--out", str(tmp_path / "grpo"), "-c", str(config),
               "--reward", "outcomes=1,approvals=2")
    assert done.returncode == 0, done.stderr
    assert "scored 4 of 4 runs with 'outcomes+approvals*2'" in done.stdout and "step 1" in done.stdout
    scored = [r.reward("outcomes+approvals*2") for r in TraceStore(runs).read()]
    assert [r.value for r in scored] == [1.0] * 4  # answered, every call fine; nobody reviewed any
    assert all(r.details["parts"]["approvals"]["value"] is None for r in scored)
    assert json.loads((tmp_path / "grpo" / "setup.json").read_text())["config"]["reward"] == "outcomes+approvals*2"
    conflict = cli("train", "grpo", "--traces", str(runs), "--out", str(tmp_path / "g2"), "-c", "reward=task",
                   "--reward", "outcomes")
    assert conflict.returncode == 2 and "--config names reward 'task': give one" in conflict.stderr
    online = cli("train", "grpo", "--suite", "bank", "--out", str(tmp_path / "g3"), "--reward", "outcomes")
    assert online.returncode == 2 and "it needs --traces" in online.stderr
    assert sum(1 for line in (runs / "traces.jsonl").read_text().splitlines() if '"kind":"reward"' in line) == 4
