"""Reference runs under a test-time rehearsal memory: imagined attempts run through the real graph in
simulated mode against the bank domain, condensed as `graph.tts` condenses them, and the reference run
recorded on the real in-process server with that memory in every act prompt."""

import json
import random

import anyio
import pytest

from envace_mcp.traces import TraceStore

HEAD = "Before acting you rehearsed this task 2 time(s) against simulated tools."


@pytest.fixture(scope="module")
def tiny_policy(tiny_qwen3_dir):
    from envace_mcp.policy import load_policy

    return load_policy(str(tiny_qwen3_dir), tool_format="compact", rehearse_format="inline")  # the shipped formats


def record(policy, out, *, seed=0, limit=12):
    from envace_mcp.lab.reference import record_reference_traces

    return anyio.run(lambda: record_reference_traces(policy, "bank", out, split="fit", limit=limit, score=False,
                                                     rehearsed=2, seed=seed))


def test_each_act_prompt_carries_the_imagined_attempts_and_the_target_stays_the_reference(tiny_policy, tmp_path):
    from envace_mcp.envs import get_suite
    from envace_mcp.train.sft import sft_rows, target_encoding

    assert record(tiny_policy, tmp_path) == 12
    runs = list(TraceStore(tmp_path).read())
    suite = get_suite("bank")
    decode = tiny_policy.tokenizer.decode
    kinds = [k for run in runs for k in run.metadata["imagined"]]
    assert {"right", "mistyped", "short"} <= set(kinds)  # drawn in 24 attempts
    for run in runs:
        task = suite.task(run.task_id)
        assert run.reward("task").value == 1.0  # the committed run is the reference, whatever was imagined
        acts = [s for s in run.steps if s.role == "act"]
        assert len(acts) == len(task.actions) + 1
        memory = decode(acts[0].prompt_ids)
        assert HEAD in memory and "Attempt 2 (no verdict):" in memory  # no critique: the embedded model gives none
        assert all(HEAD in decode(s.prompt_ids) for s in acts)  # the notes stay for the whole run
        assert "simulated" not in decode(acts[0].completion_ids)
        if "mistyped" in run.metadata["imagined"]:
            assert "-> simulated error:" in memory and "Unknown" in memory  # the domain's own rejection
        if "trap" in run.metadata["imagined"]:
            assert task.trap is not None and f"  {task.trap.tool}(" in memory
        if run.metadata["imagined"] == ["right", "right"] and task.actions:
            first = task.actions[0]
            assert "the same calls as attempt 1" in memory
            assert f"  {first.tool}({json.dumps(dict(first.arguments))[:120]}) -> simulated ok" in memory
    encode, end = target_encoding(tiny_policy.tokenizer)
    rows = sft_rows(runs, encode, end, roles=("act",))
    assert {r.role for r in rows} == {"act"} and len(rows) == sum(len(suite.task(r.task_id).actions) + 1 for r in runs)


def test_the_attempts_are_drawn_from_the_seed(tiny_policy, tmp_path):
    record(tiny_policy, tmp_path / "a", limit=6)
    record(tiny_policy, tmp_path / "b", limit=6)
    record(tiny_policy, tmp_path / "c", limit=6, seed=1)

    def notes(folder):
        return [(r.task_id, r.metadata["imagined"], next(s.prompt_ids for s in r.steps if s.role == "act"))
                for r in TraceStore(folder).read()]

    assert notes(tmp_path / "a") == notes(tmp_path / "b")
    assert notes(tmp_path / "a") != notes(tmp_path / "c")


def test_a_task_that_cannot_give_a_kind_falls_back_to_the_reference_calls():
    from envace_mcp.envs import Action, Task, get_suite
    from envace_mcp.lab.rehearsed import imagined_paths

    suite = get_suite("bank")
    refusal = Task(id="t", domain="bank", split="train", kind="k", instruction="Sell everything now.",
                   initial_state={}, actions=(), answer="I can't.")
    one = next(t for t in suite.split("fit") if len(t.actions) == 1 and t.trap is None)
    for task in (refusal, one):
        paths = imagined_paths(task, suite, {}, lambda tool, args: False, n=40, rng=random.Random(0))
        # no mutation the schema accepts (valid says no), nothing to cut short: every attempt is the reference
        assert {kind for kind, _ in paths} == {"right"}
        assert all(calls == list(task.actions) for _, calls in paths)
    assert isinstance(one.actions[0], Action)


def test_a_task_with_a_trap_is_imagined_falling_into_it():
    from envace_mcp.envs import get_suite
    from envace_mcp.lab.rehearsed import imagined_paths

    suite = get_suite("bank")
    task = next(t for t in suite.split("fit") if t.trap is not None)
    paths = imagined_paths(task, suite, {}, lambda tool, args: False, n=40, rng=random.Random(0))
    trapped = [calls for kind, calls in paths if kind == "trap"]
    assert trapped and all(calls == [*task.actions, task.trap] for calls in trapped)
    assert {kind for kind, _ in paths} == {"right", "trap"}  # nothing mistyped (valid says no), one call
