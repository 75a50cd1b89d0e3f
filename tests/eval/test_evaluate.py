"""`envace eval`: files, traces, metrics, --compare, crashing runs; a real-model smoke run per suite."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from envace_mcp.cli import app
from envace_mcp.envs import get_suite
from envace_mcp.eval.evaluate import EvalConfig, evaluate
from envace_mcp.envs.reference import reference_roles
from envace_mcp.envs import Action
from envace_mcp.testing import FunctionPolicy, build_tiny_qwen3
from envace_mcp.traces import TraceStore


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


def test_eval_writes_results_table_chart_and_traces_and_compares_two_configurations(tmp_path, tiny_model):
    out = tmp_path / "bank"
    result = CliRunner().invoke(app, [
        "eval", "--suite", "bank", "--limit", "3", "--repeats", "2", "--policy", "reference", "--out", str(out),
        "--gate", "rehearse=all", "--max-new-tokens", "8", "-c", "rehearse_max_new_tokens=300",
        "--compare", f"policy=model,model={tiny_model},repeats=1,rehearse=1,rehearse_max_new_tokens=8"])
    assert result.exit_code == 0, result.output
    a, b = (json.loads((out / x / "results.json").read_text()) for x in ("a", "b"))
    assert a["summary"]["success"]["pass@1"] == 1.0 and a["summary"]["success"]["pass^2"] == 1.0
    assert a["summary"]["tool_calls"]["f1"] == 1.0 and a["summary"]["fidelity"]["field_accuracy"] == 1.0
    assert a["summary"]["fidelity"]["executed_rehearsed_calls"] > 0 and a["summary"]["cost"]["stopped_calls"] == 0
    assert len(a["runs"]) == 6 and len(b["runs"]) == 3
    # the random tiny model writes no valid call: lower score, generated tokens counted
    assert b["summary"]["success"]["score"] < 1.0 and b["summary"]["cost"]["tokens_act"] > 0
    # test-time rehearsal's imagined runs are part of the cost, counted apart
    assert b["summary"]["cost"]["tokens_imagined_act"] > 0 and b["summary"]["cost"]["tokens_imagined_critique"] > 0
    traces_a = list(TraceStore(out / "a" / "traces").read())
    assert len(traces_a) == 6
    # the rehearse role has its own token budget (a tool's reply is longer than a tool call); act keeps 8
    budgets = {(s.role, s.sampling["max_new_tokens"]) for t in traces_a for s in t.steps if s.sampling is not None}
    assert budgets == {("act", 8), ("rehearse", 300)}
    budgets_b = {(s.role, s.sampling["max_new_tokens"]) for t in TraceStore(out / "b" / "traces").read()
                 for s in t.steps if s.sampling is not None}
    assert ("act", 8) in budgets_b and all(n == 8 for _, n in budgets_b)  # the compared budget
    assert {t.rewards[-1].name for t in TraceStore(out / "b" / "traces").read()} == {"task"}
    # each run also records its tool-call F1 against the reference calls (GRPO's call_f1_weight reads it)
    assert {t.reward("call_f1").value for t in traces_a} == {1.0}
    from envace_mcp.envs.rewards import prf
    f1 = {r["run_id"]: prf(r["calls"]["tp"], r["calls"]["made"], r["calls"]["reference"])["f1"] for r in b["runs"]}
    assert {t.run_id: t.reward("call_f1").value for t in TraceStore(out / "b" / "traces").read()} == f1
    diff = json.loads((out / "compare.json").read_text())["difference"]
    assert diff["tasks"] == 3 and diff["mean"] < 0 and diff["low"] <= diff["mean"] <= diff["high"]
    md = (out / "results.md").read_text()
    assert "reference mode=real" in md and "bootstrap interval" in md
    # a gate setting off its default, and the rehearse role's own budget, are part of the label
    assert "rehearse=0 rehearse_tokens=300 gate:rehearse=all |" in md
    assert (out / "results.png").stat().st_size > 5_000 and (out / "a" / "results.png").exists()


def test_bad_options_fail_clearly(tmp_path):
    runner = CliRunner()
    bad = runner.invoke(app, ["eval", "--suite", "bank", "--out", str(tmp_path), "--compare", "colour=blue"])
    assert bad.exit_code == 2 and "--compare: unknown setting 'colour'" in bad.output
    zero = runner.invoke(app, ["eval", "--suite", "bank", "--out", str(tmp_path), "--compare", "rehearse_max_new_tokens=0"])
    assert zero.exit_code == 2 and "greater than or equal to 1" in zero.output
    nope = runner.invoke(app, ["eval", "--suite", "tau2-airline", "--out", str(tmp_path), "-c", "transport=http"])
    assert nope.exit_code == 2 and "stdio" in nope.output
    unknown = runner.invoke(app, ["eval", "--suite", "chess", "--out", str(tmp_path)])
    assert unknown.exit_code == 2 and "tau2-airline" in unknown.output


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_crashing_run_is_recorded_as_failed_and_the_others_still_count(tmp_path):
    suite = get_suite("bank")
    tasks = suite.split("test")[:3]
    broken = tasks[1].id

    def act(request):
        if request.task == tasks[1].instruction:
            raise RuntimeError("the model server went away")
        task = next(t for t in tasks if t.instruction == request.task)
        return reference_roles(suite, task)["act"](request)

    results = await evaluate(suite, tasks, EvalConfig(suite="bank", concurrency=2, gate={"rehearse": "none"}),
                             out=tmp_path, policy=FunctionPolicy(act=act))
    by_task = {r["task_id"]: r for r in results["runs"]}
    assert by_task[broken]["status"] == "failed" and by_task[broken]["score"] == 0.0
    assert "went away" in (by_task[broken].get("error") or json.dumps(by_task[broken]))
    assert all(by_task[t.id]["passed"] for t in tasks if t.id != broken)
    assert results["summary"]["success"]["pass@1"] == pytest.approx(2 / 3)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(results["summary"], default=str))


@pytest.mark.anyio
async def test_a_tasks_sampled_repeats_are_different_runs_each_reproducible_alone(tmp_path, tiny_model):
    """Repeat r samples with seed + r: one seed for every repeat gave K copies of one run (no group
    signal, a pass^k that measured nothing); the same seed again gives the same run."""
    from envace_mcp.policy import load_policy

    suite = get_suite("bank")
    task = suite.split("test")[0]
    policy = load_policy(str(tiny_model))
    settings = dict(suite="bank", temperature=1.0, seed=5, max_new_tokens=12, gate={"rehearse": "none"},
                    limits={"max_steps": 2})

    def act_ids(folder):
        runs = sorted(TraceStore(folder / "traces").read(), key=lambda t: t.sampling["act"]["seed"])
        return [(t.sampling["act"]["seed"], [s.completion_ids for s in t.steps_of("act")]) for t in runs]

    await evaluate(suite, [task], EvalConfig(repeats=3, **settings), out=tmp_path / "k3", policy=policy)
    three = act_ids(tmp_path / "k3")
    assert [seed for seed, _ in three] == [5, 6, 7]
    assert len({json.dumps(ids) for _, ids in three}) == 3
    await evaluate(suite, [task], EvalConfig(repeats=1, **{**settings, "seed": 6}), out=tmp_path / "again", policy=policy)
    assert act_ids(tmp_path / "again") == [three[1]]


@pytest.mark.anyio
async def test_a_bad_gate_in_python_settings_is_refused_before_anything_runs_or_is_written(tmp_path):
    suite = get_suite("bank")
    with pytest.raises(ValueError, match="(?s)gate.*rehearse must be 'all', 'writes' or 'none', not 'some'"):
        await evaluate(suite, suite.split("test")[:1], EvalConfig(suite="bank", gate={"rehearse": "some"}),
                       out=tmp_path / "out", policy=FunctionPolicy(act=lambda request: "done"))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["bank", "retail", "tau2-airline", "tau2-retail", "bfcl-base", "bfcl-simple"])
def test_embedded_model_smoke_run_per_suite(tmp_path, suite):
    """The real default model through the whole path on one test task per suite (no accuracy claim).

    Whatever the model writes, the run finishes: a cut-off or malformed call, a tool error and the step
    limit are data in the trace, and a crash (`failed`) is a bug here, never a model's bad day."""
    out = tmp_path / suite
    result = CliRunner().invoke(app, ["eval", "--suite", suite, "--limit", "1", "--out", str(out),
                                      "--max-new-tokens", "24", "--limits", "max_steps=2"])
    assert result.exit_code == 0, result.output
    res = json.loads((out / "results.json").read_text())
    run = res["runs"][0]
    assert run["status"] == "finished" and "error" not in run, run
    assert run["score"] is not None and run["tokens"].get("act", 0) > 0, run
    assert res["summary"]["cost"]["failed_runs"] == 0
    (trace,) = TraceStore(out / "traces").read()
    assert trace.status == "finished" and trace.error is None and trace.run_id == run["run_id"]


def test_the_noop_policy_measures_a_suites_floor(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--suite", "bank", "--policy", "noop", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    # doing nothing passes exactly the 8 refusals of another customer's account among the 96 test tasks
    assert summary["success"]["tasks"] == 96 and summary["success"]["pass@1"] == pytest.approx(8 / 96)
    assert summary["tool_calls"]["made"] == 0 and summary["cost"]["real_calls"] == 0


def test_compare_pairs_two_saved_evaluations_by_task_and_refuses_ones_that_measured_other_tasks(tmp_path):
    runner = CliRunner()
    for policy, limit in (("reference", "4"), ("noop", "6")):  # the floor ran two tasks more
        done = runner.invoke(app, ["eval", "--suite", "bank", "--policy", policy, "--limit", limit,
                                   "--out", str(tmp_path / policy)])
        assert done.exit_code == 0, done.output
    scores = {policy: {r["task_id"]: r["score"] for r in json.loads((tmp_path / policy / "results.json").read_text())["runs"]}
              for policy in ("reference", "noop")}
    paired = sorted(scores["reference"])
    expected = sum(scores["noop"][t] - scores["reference"][t] for t in paired) / len(paired)
    assert expected < 0  # doing nothing loses on some of the first four tasks
    result = runner.invoke(app, ["compare", str(tmp_path / "reference"), str(tmp_path / "noop" / "results.json"),
                                 "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    diff = json.loads((tmp_path / "cmp" / "compare.json").read_text())["difference"]
    assert diff["tasks"] == 4 and diff["mean"] == pytest.approx(expected) and diff["low"] <= diff["mean"] <= diff["high"]
    assert "2 task(s) the other did not run are left out" in result.output
    md = (tmp_path / "cmp" / "results.md").read_text()
    assert "reference mode=real" in md and "noop mode=real" in md and "bootstrap interval" in md
    assert diff["detectable"] > 0 and f"about {diff['tasks_for_target']} tasks" in md  # what 4 tasks could find
    assert f"detectable with 80 % power: {diff['detectable']:.2f}" in result.output
    assert (tmp_path / "cmp" / "results.png").stat().st_size > 5_000
    # one row per paired task, the changed ones first, with both sides' scores and calls
    changed = [t for t in paired if scores["noop"][t] != scores["reference"][t]]
    assert f"({len(changed)} of 4 changed" in md and changed
    rows = [line for line in md.splitlines() if line.startswith("| bank/test/")]
    assert [row.split(" | ")[0][2:] for row in rows] == changed + [t for t in paired if t not in changed]
    for row in rows:
        task, kind, sa, calls_a, sb, calls_b, diff_t = row.strip("| ").split(" | ")
        assert float(sa) == pytest.approx(scores["reference"][task], abs=0.005) and calls_b == "0 / 0"
        assert float(diff_t) == pytest.approx(scores["noop"][task] - scores["reference"][task], abs=0.005)
        assert int(calls_a.split(" / ")[0]) > 0  # the reference policy makes the task's calls
    # the same configuration twice is told apart by folder; the pairing is then exactly zero
    same = runner.invoke(app, ["compare", str(tmp_path / "noop"), str(tmp_path / "noop"), "--out", str(tmp_path / "same")])
    assert same.exit_code == 0 and f"rehearse=0 ({tmp_path / 'noop'})" in (tmp_path / "same" / "results.md").read_text()
    assert "+0.000  95 % CI [+0.000, +0.000]" in same.output
    assert "paired tasks" not in same.output  # no spread: no claim about how many tasks a difference needs
    # another split, or no task in common: nothing to pair, one error line
    other = runner.invoke(app, ["eval", "--suite", "bank", "--policy", "noop", "--split", "validation", "--limit", "2",
                                "--out", str(tmp_path / "val")])
    assert other.exit_code == 0, other.output
    refused = runner.invoke(app, ["compare", str(tmp_path / "noop"), str(tmp_path / "val")])
    assert refused.exit_code == 2 and "different tasks: bank/test and bank/validation" in refused.output
    apart = runner.invoke(app, ["eval", "--suite", "bank", "--policy", "noop", "--task", "bank/test/0050",
                                "--out", str(tmp_path / "apart")])
    assert apart.exit_code == 0, apart.output
    refused = runner.invoke(app, ["compare", str(tmp_path / "noop"), str(tmp_path / "apart")])
    assert refused.exit_code == 2 and "no task in common" in refused.output


def test_an_evaluation_resumes_in_its_folder_and_refuses_another_configuration_there(tmp_path):
    """Each finished run is journaled; the same command runs only what is missing (a killed evaluation,
    a torn last line, a crashed run, more tasks), and another configuration cannot mix its runs in."""
    runner, out = CliRunner(), tmp_path / "ev"
    base = ["eval", "--suite", "bank", "--policy", "reference", "--out", str(out)]
    first = runner.invoke(app, [*base, "--limit", "2"])
    assert first.exit_code == 0, first.output
    assert "resuming" not in first.output
    journal = (out / "runs.jsonl").read_text().splitlines()
    assert len(journal) == 3 and json.loads(journal[0])["settings"]["policy"] == "reference"
    # killed while journaling its second run: the line is torn; and the first run had crashed
    head, one, two = journal
    crashed = {"run": {**json.loads(one)["run"], "status": "failed", "score": 0.0}}
    (out / "runs.jsonl").write_text("\n".join([head, json.dumps(crashed), two[: len(two) // 2]]))
    more = runner.invoke(app, [*base, "--limit", "4", "-c", "concurrency=2"])  # the selection may change
    assert more.exit_code == 0, more.output
    assert "0 of 4 runs already there" not in more.output  # nothing counted but finished runs
    results = json.loads((out / "results.json").read_text())
    assert [r["task_id"] for r in results["runs"]] == [t.id for t in get_suite("bank").split("test")[:4]]
    assert results["resumed"] == 0 and results["summary"]["success"]["pass@1"] == 1.0
    # the torn line was cut, and every run is journaled once per attempt that finished
    lines = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [next(iter(x)) for x in lines] == ["settings", "run", "run", "run", "run", "run"]
    again = runner.invoke(app, [*base, "--limit", "4"])
    assert again.exit_code == 0 and f"resuming {out}: 4 of 4 runs already there" in again.output
    assert json.loads((out / "results.json").read_text())["resumed"] == 4
    # the two runs whose records were lost were run again; results name the runs they count
    traces = list(TraceStore(out / "traces").read())
    assert len(traces) == 6 and {r["run_id"] for r in results["runs"]} == {t.run_id for t in traces[2:]}
    # another configuration in the same folder: one line, exit 2, nothing written
    other = runner.invoke(app, ["eval", "--suite", "bank", "--policy", "noop", "--limit", "4", "--out", str(out)])
    assert other.exit_code == 2 and "holds runs of another configuration (policy: \"reference\" → \"noop\"" in other.output
    assert len((out / "runs.jsonl").read_text().splitlines()) == 6
    (out / "runs.jsonl").write_text("not json\n")
    torn = runner.invoke(app, [*base, "--limit", "1"])
    assert torn.exit_code == 2 and "not an evaluation journal" in torn.output


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_gates_value_counts_harmful_calls_stopped_and_requested_calls_blocked(tmp_path):
    """An agent that also makes a careless destructive call on each refusal / error task (the task's trap,
    or the overdraft it was asked for), behind a perfect world model, then one predicting an error always."""
    suite = get_suite("bank")
    kinds = ("transfer_funds", "insufficient_funds", "other_customers_account", "market_closed")
    tasks = [next(t for t in suite.split("test") if t.kind == kind) for kind in kinds]
    overdraft = Action("transfer", {"from_account_id": tasks[1].actions[0].arguments["account_id"],
                                    "to_account_id": tasks[1].instruction.rstrip(".").split()[-1], "amount": 1e6})
    traps = {tasks[1].id: overdraft, tasks[2].id: tasks[2].trap, tasks[3].id: tasks[3].trap}
    careless = {t.instruction: reference_roles(suite, t, actions=[*t.actions, *([traps[t.id]] if t.id in traps else [])],
                                               answer=t.answer) for t in tasks}

    def role(name):
        def answer(request):
            task = request.task if name == "act" else next(m.content for m in request.history if m.type == "human")
            return careless[task][name](request)
        return answer

    def pessimist(request):
        return '<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", "message": "no"}}</execution_result>'

    settings = EvalConfig(suite="bank", concurrency=4)
    perfect = await evaluate(suite, tasks, settings, out=tmp_path / "perfect",
                             policy=FunctionPolicy(act=role("act"), rehearse=role("rehearse")))
    transfer, insufficient, other, closed = ({r["task_id"]: r["destructive"] for r in perfect["runs"]}[t.id]
                                             for t in tasks)
    assert transfer == [{"tool": "transfer", "decision": "execute", "stopped": False, "would": "requested"}]
    # the server refuses the overdraft: a perfect world model predicts it, the gate blocks it
    assert insufficient == [{"tool": "transfer", "decision": "block", "stopped": True, "would": "fail"}]
    # another customer's account, a limit order while the market is closed: policies the server lets
    # through, so even a perfect world model predicts success and the gate lets them run
    assert other == [{"tool": "transfer", "decision": "execute", "stopped": False, "would": "unrequested"}]
    assert closed == [{"tool": "place_order", "decision": "execute", "stopped": False, "would": "unrequested"}]
    g = perfect["summary"]["gate_value"]
    assert (g["proposed"], g["harmful"], g["harmful_stopped"], g["requested"], g["false_blocks"]) == (4, 3, 1, 1, 0)
    assert (g["would_fail"], g["would_fail_stopped"], g["unrequested"], g["unrequested_stopped"]) == (1, 1, 2, 0)
    assert g["harmful_stopped_rate"] == pytest.approx(1 / 3) and g["false_block_rate"] == 0.0
    # the perfect world model gets every field of the executed transfers and orders, echoed and computed
    f = perfect["summary"]["fidelity"]
    assert f["executed_rehearsed_calls"] == 3 and f["echoed_fields"] > 0 and f["new_fields"] > 0
    assert f["echoed_field_accuracy"] == 1.0 and f["new_field_accuracy"] == 1.0
    assert "| 3 | 1.000 | 1.000 | 1.000 (n=" in (tmp_path / "perfect" / "results.md").read_text()

    blocking = await evaluate(suite, tasks, settings, out=tmp_path / "pessimist",
                              policy=FunctionPolicy(act=role("act"), rehearse=pessimist))
    g = blocking["summary"]["gate_value"]
    assert (g["harmful"], g["harmful_stopped"], g["requested"], g["false_blocks"]) == (3, 3, 1, 1)
    assert "| 3 / 3 (100 %) |" in (tmp_path / "pessimist" / "results.md").read_text()
    # nothing real is at stake in simulated mode: no destructive calls are counted there
    simulated = await evaluate(suite, tasks[:1], EvalConfig(suite="bank", mode="simulated"), out=tmp_path / "sim",
                               policy=FunctionPolicy(act=role("act"), rehearse=role("rehearse")))
    assert "gate_value" not in simulated["summary"]
