"""Teach the world model your tools: real calls in, a fitted rehearse role out, measured tool by tool.

Plumbing on the tiny Qwen3-shaped model (accuracy belongs to the embedded model: docs/evidence.md); the
calls are real replies of the bundled bank server over stdio."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from envace_mcp.envs import get_suite
from envace_mcp.policy.trust import read_trust
from envace_mcp.lab.suite_calls import record_suite_calls
from envace_mcp.traces import Step, Trace, TraceStore
from envace_mcp.worldmodel import observed_calls, split_episodes

ENVACE = [sys.executable, "-m", "envace_mcp.cli"]


def envace(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*ENVACE, *args], capture_output=True, text=True, timeout=timeout,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


@pytest.fixture(scope="module")
def bank_calls(tmp_path_factory) -> Path:
    """Real calls of 12 bank tasks' reference solutions, one run each, with the catalog attached."""
    out = tmp_path_factory.mktemp("bank-calls")
    suite = get_suite("bank")
    anyio.run(record_suite_calls, suite, list(suite.split("train"))[:12], out)
    return out


def _step(i, tool, arguments, result, **fields):
    return Step(index=i, role="tool", call_id=f"c{i}", time=time.time(), tool=tool, arguments=arguments,
                result=result, **fields)


def _reply(text, error=False, kind=None):
    return {"tool": "x", "content": [{"type": "text", "text": text}], "is_error": error, "error_kind": kind,
            "structured_content": None}


def test_only_calls_the_server_answered_become_examples_each_seeing_the_replies_before_it(bank_catalog):
    tools = [s.to_dict() for s in bank_catalog]
    trace = Trace(run_id="r1", task="Move 5 to savings", started_at=time.time(), tools=tools, steps=[
        _step(0, "get_balance", {"account_id": "CHK-1"}, _reply('{"balance": 10}')),
        _step(1, "transfer", {"amount": 5}, _reply("Not executed (block): ..."), decision="block"),
        _step(2, "transfer", {"amount": -1}, _reply("bad", True, "invalid_arguments")),
        _step(3, "transfer", {"from_account": "CHK-1", "to_account": "SAV-1", "amount": 5},
              _reply("Insufficient funds", True, "tool_error")),
        _step(4, "made_up_tool", {}, _reply("?")),
    ])
    calls, unknown = observed_calls([trace])
    assert [c.tool for c in calls] == ["get_balance", "transfer"] and unknown == {"made_up_tool": 1}
    last = calls[1]
    assert last.failed and last.request.call.arguments["amount"] == 5
    shown = [getattr(m, "content", "") for m in last.request.history]
    assert shown[0] == "Move 5 to savings" and '{"balance": 10}' in shown and "Not executed (block): ..." not in shown
    assert last.earlier == [{"balance": 10}] and last.request.examples[0].tool == "get_balance"


def test_a_log_imported_twice_under_new_run_ids_splits_alike(bank_calls):
    """`traces import` gives each run a fresh id, so a split by id held out other calls each time the same
    log was imported (booking: 180 held-out calls one time, 166 the next), and no figure could be re-run."""
    runs = list(TraceStore(bank_calls).read())
    renamed = {r.run_id: f"again-{i}" for i, r in enumerate(runs)}
    again = [r.model_copy(update={"run_id": renamed[r.run_id]}) for r in reversed(runs)]
    train, held = split_episodes(observed_calls(runs)[0], 0.25, seed=3)
    assert len(held) == 3 and split_episodes(observed_calls(again)[0], 0.25, seed=3) == (
        [renamed[e] for e in train], [renamed[e] for e in held])


def test_the_split_is_by_run_seeded_and_keeps_a_replayed_call_with_the_run_it_came_from(bank_calls):
    runs = list(TraceStore(bank_calls).read())
    variant = runs[0].model_copy(update={"run_id": "variant", "metadata": {"mutated_from": runs[0].run_id}})
    calls, _ = observed_calls([*runs, variant])
    train, held = split_episodes(calls, 0.25, seed=3)
    assert (train, held) == split_episodes(calls, 0.25, seed=3) and (train, held) != split_episodes(calls, 0.25, seed=4)
    assert not set(train) & set(held) and len(held) == 3 and "variant" not in train + held
    assert sorted(train + held) == sorted(r.run_id for r in runs)  # each recorded run one episode, no other
    own, _ = observed_calls(runs)
    first = sum(c.episode == runs[0].run_id for c in own)
    assert first and [c.episode for c in calls[len(own):]] == [runs[0].run_id] * first  # the replay's are its origin's


def test_caps_take_whole_runs_and_the_split_lists_the_runs_it_measured(bank_calls):
    from envace_mcp.worldmodel.fit import split

    runs = list(TraceStore(bank_calls).read())
    calls, _ = observed_calls(runs)
    train, held, how = split(calls, 0.5, seed=0)
    few_train, few_held, capped = split(calls, 0.5, seed=0, max_calls=3, max_held=2)
    assert 3 <= len(few_train) < len(train) and 2 <= len(few_held) < len(held)
    for part in (few_train, few_held):  # whole runs: every call of a run taken, or none
        taken = {c.episode for c in part}
        assert len(part) == sum(c.episode in taken for c in calls)
    assert capped["held_out_runs"] == sorted({c.episode for c in few_held}) != how["held_out_runs"]
    assert capped["logged_calls"] == len(calls) > len(few_train) + len(few_held) and capped["max_held"] == 2


def test_the_command_takes_the_librarys_caps_by_default():
    from envace_mcp.worldmodel.fit import MAX_CALLS, MAX_HELD

    shown = " ".join(envace("world-model", "fit", "--help").stdout.replace("│", " ").split())  # as wrapped in its box
    assert f"up to {MAX_HELD} calls (0: all of both) [default: {MAX_CALLS}" in shown
    assert "the rules learn from every training run" in shown


@pytest.fixture(scope="module")
def fitted(bank_calls, tiny_qwen3_dir, tmp_path_factory) -> tuple[Path, str]:
    """A world model fitted with the CLI, and what the command printed."""
    out = tmp_path_factory.mktemp("fitted") / "wm"
    done = envace("world-model", "fit", "--traces", str(bank_calls), "--out", str(out), "--model", str(tiny_qwen3_dir),
                  "--holdout", "0.25", "-c", "epochs=4,batch_size=4,lr=3e-3")
    assert done.returncode == 0, done.stderr[-2000:]
    return out, done.stdout


def written(folder: Path) -> tuple[dict, dict]:
    """What a fit wrote into `folder`: its setup (fit.json) and its report (report.json)."""
    return json.loads((folder / "fit.json").read_text()), json.loads((folder / "report.json").read_text())


def test_a_fit_measures_its_held_out_runs_tool_by_tool_and_writes_the_adapter_and_a_plot(fitted, bank_calls):
    out, printed = fitted
    setup, report = written(out)
    assert "all tools" in printed and "trust.json" in printed
    assert report["overall"]["calls"] == setup["held_out_calls"] > 0 and len(setup["held_out_runs"]) == 3
    assert {c["run"] for c in report["calls"]} == set(setup["held_out_runs"])  # nothing it trained on
    assert not set(setup["held_out_runs"]) & set(setup["trained_runs"])
    catalog = {t["name"] for t in next(iter(TraceStore(bank_calls).read())).tools}
    assert report["tools"] and set(report["tools"]) <= catalog
    for figures in report["tools"].values():
        assert set(figures["field_accuracy"]) == {"echoed", "read", "computed"} and figures["nll_per_token"] > 0
    listed = [c for c in report["calls"] if c.get("absent") or c.get("wrong")]
    assert listed and not any(c["failed"] for c in listed)  # the tiny model's misses, on successful replies only
    assert (out / "report.png").stat().st_size > 10_000 and (out / "adapter_config.json").exists()


def test_every_figure_of_a_fit_stands_beside_its_floor(fitted):
    """Plumbing: the held-out runs here are reference solutions with no failure, so the always-succeeds floor
    is 1.0 and one that ignored failures would pass here; test_measure.py pins it on hand-built calls."""
    _, report = written(fitted[0])
    for figures in [*report["tools"].values(), report["overall"]]:
        floors = figures["floors"]
        assert floors["always_succeeds"] == (figures["calls"] - figures["failures"]) / figures["calls"]
        assert floors["majority"] is not None and set(figures["field_floor"]) == {"echoed", "read", "computed"}
        assert figures["unusable"] == 0.0  # decoded status first: readable, or UNKNOWN at the budget


def test_a_fits_trust_table_names_every_measured_tool_and_the_tiny_model_earns_nothing(fitted):
    out, _ = fitted
    _, report = written(out)
    table = read_trust(out)
    assert set(table.tools) == set(report["tools"]) and not table.notes  # every measured tool; its figures are its own
    assert not any(t.believe_failures or t.skip_approval for t in table.tools.values())
    assert all(t.fail_closed and t.server == "bank" and t.behaviour for t in table.tools.values())


def test_a_fitted_world_model_predicts_the_held_out_replies_better_than_the_untrained_model(fitted, bank_calls,
                                                                                           tiny_qwen3_dir):
    from envace_mcp.policy.transformers import TransformersPolicy
    from envace_mcp.train.sft import reply_target, target_encoding
    from envace_mcp.worldmodel import read_calls

    setup, report = written(fitted[0])
    _, calls, _ = read_calls(bank_calls)
    held = [c for c in calls if c.episode in set(setup["held_out_runs"])]
    bare = TransformersPolicy.from_pretrained(str(tiny_qwen3_dir), tool_format="compact", rehearse_format="inline")
    encode, end = target_encoding(bare.tokenizer)
    nll = tokens = 0.0
    for call in held:
        prompt, close = bare.rehearse_prompt(call.request)
        target = encode(reply_target(call.result, "inline", close)) + [end]
        nll, tokens = nll - sum(bare.score(prompt, target)), tokens + len(target)
    assert report["overall"]["nll_per_token"] < 0.97 * nll / tokens  # deterministic: 6.42 against 6.75


def test_report_on_the_fits_own_log_measures_exactly_the_calls_the_fit_held_out(fitted, bank_calls, tiny_qwen3_dir,
                                                                                 tmp_path):
    out, _ = fitted
    setup, report = written(out)
    again = envace("world-model", "report", "--adapter", str(out), "--traces", str(bank_calls),
                   "--model", str(tiny_qwen3_dir), "--out", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"the {setup['held_out_calls']} calls of the 3 runs its fit held out" in " ".join(again.stdout.split())
    measured = json.loads((tmp_path / "again" / "report.json").read_text())
    assert [(c["run"], c["index"]) for c in measured["calls"]] == [(c["run"], c["index"]) for c in report["calls"]]


def test_report_does_not_overwrite_a_trust_table_unasked(fitted, bank_calls, tiny_qwen3_dir, tmp_path):
    import shutil

    out, _ = fitted
    before = {name: (out / name).read_bytes() for name in ("trust.json", "report.json")}
    copy = shutil.copytree(bank_calls, tmp_path / "copy")
    refused = envace("world-model", "report", "--adapter", str(out), "--traces", str(copy), "--model", str(tiny_qwen3_dir))
    assert refused.returncode == 2 and "already has a trust table" in refused.stderr
    assert {name: (out / name).read_bytes() for name in before} == before


def test_report_on_a_copy_of_the_log_elsewhere_leaves_out_the_runs_the_fit_trained_on(fitted, bank_calls,
                                                                                       tiny_qwen3_dir, tmp_path):
    import shutil

    out, _ = fitted
    setup, _ = written(out)
    copy = shutil.copytree(bank_calls, tmp_path / "copy")  # another path: its runs are still known by id
    moved = envace("world-model", "report", "--adapter", str(out), "--traces", str(copy), "--model", str(tiny_qwen3_dir),
                   "--out", str(tmp_path / "moved"))
    assert moved.returncode == 0, moved.stderr[-2000:]
    measured = json.loads((tmp_path / "moved" / "report.json").read_text())
    assert measured["overall"]["calls"] > 0 and {c["run"] for c in measured["calls"]} <= set(setup["held_out_runs"])
    from envace_mcp.worldmodel import read_calls

    _, calls, _ = read_calls(bank_calls)
    left = re.search(r"left out: (\d+) that match its training calls", " ".join(moved.stdout.split()))
    assert left and int(left[1]) + measured["overall"]["calls"] == len(calls)
    assert int(left[1]) >= setup["training_calls"] and "runs its fit held out" not in moved.stdout


def test_a_fit_writes_the_copy_and_status_rules_of_its_training_calls_and_the_loaded_world_model_carries_them(
        fitted, bank_calls, tiny_qwen3_dir):
    from envace_mcp.policy import load_policy, status_rules
    from envace_mcp.policy.copying import learn, read_rules
    from envace_mcp.policy.logged import learn_replies
    from envace_mcp.worldmodel import read_calls

    out, printed = fitted
    setup, report = (json.loads((out / name).read_text()) for name in ("fit.json", "report.json"))
    _, calls, _ = read_calls(bank_calls)
    trained = [c for c in calls if c.episode in set(setup["trained_runs"])]
    rules = read_rules(out)
    assert rules is not None and {t: r for t, (_, r) in rules.tools.items()} == learn(trained)  # (14 calls: few)
    stable, lookups, kinds = learn_replies(trained)
    assert {t: found for t, (_, found) in rules.stable.items()} == stable
    assert {t: found for t, (_, found) in rules.lookups.items()} == lookups
    assert {t: kind for t, (_, kind) in rules.kinds.items()} == kinds  # (none here: 5 replies of a tool needed)
    assert report["copy_rules"] == rules.summary() and ("copied by rule" in printed) == bool(rules.summary())
    assert report["reply_kinds"] == rules.kind_summary()
    assert all(server == "bank" and behaviour for (server, behaviour), _ in rules.tools.values())
    ruled = {t: {r.field for r in found} for t, (_, found) in rules.tools.items()}
    for t, (_, found) in rules.stable.items():  # a logged reply is copied whole
        ruled.setdefault(t, set()).update(k for reply in found.replies.values() for k in reply)
    for t, (_, found) in rules.lookups.items():  # a field logged for the same argument
        ruled.setdefault(t, set()).update(re.sub(r"\[\d+\]", "[]", p) for lookup in found for p in lookup.held)
    copied = [c for c in report["calls"] if c.get("copied")]
    assert all(set(c["copied"]) <= ruled[c["tool"]] for c in copied)
    loaded = load_policy(str(tiny_qwen3_dir), adapter=str(out))
    assert loaded.copy_rules.tools == rules.tools
    learned = status_rules.learn(trained)
    table = status_rules.read_rules(out)
    assert {t: r for t, (_, r) in table.tools.items()} == learned.rules and table.known == set(learned.known)
    assert {t: counts for t, (_, counts) in table.unforeseen.items()} == learned.unforeseen  # every tool's, ruled or not
    assert report["status_rules"] == table.summary() and loaded.status_rules.tools == table.tools
    assert ("failures predicted by rule" in printed) == bool(table.tools) != ("no status rule" in printed)
    assert report["overall"]["by_rule"]["calls"] == sum(bool(c.get("ruled")) for c in report["calls"])
    longest = json.loads((out / "envace.json").read_text())["reply_tokens"]  # each tool's longest training reply
    assert set(longest) == {c.tool for c in trained} and all(n > 0 for n in longest.values())
    assert loaded.reply_budgets == {tool: n + (n + 4) // 5 + 8 for tool, n in longest.items()}


def test_a_fitted_world_model_recalls_its_training_calls_and_its_trust_is_bound_to_them(fitted, bank_calls, tiny_qwen3_dir,
                                                                                         tmp_path):
    """The fit keeps its training calls as the log its rehearsals recall (recall.jsonl): never a held-out run's,
    carried by the loaded policy, measured beside what the log alone predicts, and part of what the trust
    table is bound to (a log changed afterwards is not the one that was measured)."""
    import shutil

    from envace_mcp.policy import load_policy
    from envace_mcp.policy.recall import CallLog

    from envace_mcp.train.config import SFTConfig
    from envace_mcp.worldmodel import fit

    assert CallLog.read(fitted[0]) is None  # recall is off unless asked for (it scored below the fit without it)
    out = tmp_path / "recalling"
    fit(bank_calls, out, model=str(tiny_qwen3_dir), holdout=0.25, recall=True,
        settings=SFTConfig(epochs=1, batch_size=4, lr=3e-3))
    setup = json.loads((out / "fit.json").read_text())
    log = CallLog.read(out)
    assert log is not None and len(log) == setup["recalls"] == setup["training_calls"] and not log.skipped
    assert {e.episode for e in log.entries()} == set(setup["trained_runs"])  # no held-out run is recalled
    report = json.loads((out / "report.json").read_text())
    assert all(f["floors"]["nearest_call"] is not None for f in [report["overall"], *report["tools"].values()])
    policy = load_policy(str(tiny_qwen3_dir), adapter=str(out))
    assert len(policy.recall) == len(log) and not policy.trust.notes
    moved = shutil.copytree(out, tmp_path / "wm")
    lines = (moved / "recall.jsonl").read_text().splitlines()
    (moved / "recall.jsonl").write_text("\n".join(lines[1:]) + "\n")
    written = json.loads((moved / "trust.json").read_text())
    for entry in written["tools"].values():  # as if the tiny model had earned it: the log it recalls now differs
        entry["believe_failures"] = True
    (moved / "trust.json").write_text(json.dumps(written))
    table = load_policy(str(tiny_qwen3_dir), adapter=str(moved)).trust
    assert table.notes and "other weights" in table.notes[0] and not any(t.believe_failures for t in table.tools.values())


def test_a_log_imported_again_is_not_measured_on_the_calls_it_trained(fitted, bank_calls, tiny_qwen3_dir, tmp_path):
    """From outside: importing the same log twice gave new run ids, and the report measured the world model
    on the very calls it trained on. Now a call whose content matches a training call is left out, and said."""
    out, _ = fitted
    setup = json.loads((out / "fit.json").read_text())
    again = tmp_path / "reimported"
    for trace in TraceStore(bank_calls).read():
        TraceStore(again).append(trace.model_copy(update={"run_id": f"new-{trace.run_id}"}))
    done = envace("world-model", "report", "--adapter", str(out), "--traces", str(again), "--model", str(tiny_qwen3_dir),
                  "--out", str(tmp_path / "report"))
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads((tmp_path / "report" / "report.json").read_text())["overall"]["calls"]
    left = f"left out: {setup['training_calls']} that match its training calls"
    assert left in done.stdout.replace("\n", " ") and measured <= setup["held_out_calls"]


def test_bad_input_is_one_line_and_exit_2(tmp_path, tiny_qwen3_dir, bank_calls):
    empty = tmp_path / "empty"
    TraceStore(empty).append(Trace(run_id="r", started_at=time.time()))
    done = envace("world-model", "fit", "--traces", str(empty), "--out", str(tmp_path / "o"), "--model", str(tiny_qwen3_dir))
    assert done.returncode == 2 and "nothing to fit a world model on" in done.stderr and "Traceback" not in done.stderr
    one = tmp_path / "one"
    TraceStore(one).append(next(iter(TraceStore(bank_calls).read())))
    done = envace("world-model", "fit", "--traces", str(one), "--out", str(tmp_path / "o"), "--model", str(tiny_qwen3_dir))
    assert done.returncode == 2 and "need at least two runs" in done.stderr
    assert not (tmp_path / "o" / "adapter_config.json").exists()
    done = envace("world-model", "report", "--adapter", str(tmp_path / "missing"), "--traces", str(bank_calls))
    assert done.returncode == 2 and "does not exist" in done.stderr


@pytest.mark.anyio
async def test_the_middleware_rehearses_with_a_fitted_world_model_and_its_trust_table_decides(fitted, tiny_qwen3_dir):
    """`RehearsalMiddleware(policy, tools=..., world_model=DIR)` in a `create_agent` agent on the real bank
    server: the fitted folder rehearses, and what it predicts for a tool it earned no trust on is shown to
    the approver, never acted on."""
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage

    from envace_mcp.graph.gate import decide
    from envace_mcp.graph.middleware import RehearsalMiddleware
    from envace_mcp.policy import Prediction, ToolCall
    from envace_mcp.policy.transformers import TransformersPolicy
    from envace_mcp.toolbox import Toolbox

    class Proposes(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

    call = {"name": "transfer", "args": {"from_account_id": "CHK-1001", "to_account_id": "SAV-1001", "amount": 5},
            "id": "c1"}
    model = Proposes(messages=iter([AIMessage(content="", tool_calls=[call]), AIMessage(content="done")]))
    asked = []

    def approver(request):
        asked.append(request)
        return {"type": "reject", "message": "not now"}

    policy = TransformersPolicy.from_pretrained(str(tiny_qwen3_dir), tool_format="compact", rehearse_format="inline")
    folder, _ = fitted
    async with Toolbox({"bank": get_suite("bank").build_server()}) as toolbox:
        tools = toolbox.langchain_tools()
        middleware = RehearsalMiddleware(policy, tools=tools, world_model=folder, approve=approver)
        assert middleware.core.policy.rehearse_policy.adapter_folder == str(folder)
        trust = middleware.core.gate.trust
        assert trust is not None and not any(t.believe_failures for t in trust.values())  # the tiny model earns nothing
        out = await create_agent(model, tools=tools, middleware=[middleware]).ainvoke(
            {"messages": [HumanMessage(content="Move 5 to savings")]})
    record = out["rehearsals"][0]
    assert record["prediction"] is not None and len(asked) == 1 and record["approved"] is False
    assert "approval required" in record["reason"] and f"world model {folder}" in middleware.core.policy.name
    # The table, not the tiny model's luck, decides: the gate the middleware loaded, given a predicted failure
    # of `transfer` (which the tiny model may or may not predict above), shows it and asks, where the same
    # gate without a table stops the call.
    gate = middleware.core.gate
    proposed = ToolCall(id="c1", name="transfer", arguments=call["args"])
    fails = Prediction(tool="transfer", status="tool_error", code="INSUFFICIENT_FUNDS", message="not enough money")
    shown = decide(proposed, middleware.core.specs["transfer"], fails, mode="real", config=gate)
    assert shown.action == "ask" and "'transfer' (trust table), so its prediction (INSUFFICIENT_FUNDS) is shown, " \
        "not acted on" in shown.reason
    untrusted = decide(proposed, middleware.core.specs["transfer"], fails, mode="real",
                       config=gate.model_copy(update={"trust": None}))
    assert untrusted.action == "block"
    # and the run above went through that gate: its recorded reason is the one it gives for what was predicted
    predicted = Prediction.model_validate(record["prediction"])
    assert record["reason"] == decide(proposed, middleware.core.specs["transfer"], predicted, mode="real",
                                      config=gate).reason
