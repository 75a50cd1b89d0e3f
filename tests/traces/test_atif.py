"""ATIF (Agent Trajectory Interchange Format v1.8): recorded runs out as trajectories the `atif` models
accept, other agents' trajectories in as traces world-model fit reads, and whatever a trajectory file holds
(torn, mistyped, too deep, too big, escape sequences) skipped and said why, never a traceback. Runs are
recorded against the bank server in-process, the policy scripted; the CLI runs as users run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import anyio
import atif
import pytest
from langchain_core.messages import HumanMessage

from envace_mcp.envs import Episode, get_suite
from envace_mcp.errors import UserError
from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox, ToolResult
from envace_mcp.traces import Reward, Step, Trace, TraceStore, read_atif, record_run, write_atif
from envace_mcp.traces.atif import from_atif, to_atif
from envace_mcp.traces.importing import MAX_DEPTH
from envace_mcp.traces.schema import RESULT_CHARS
from envace_mcp.worldmodel.calls import observed_calls
from envace_mcp.worldmodel.fit import read_calls

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
ENVACE = [sys.executable, "-m", "envace_mcp.cli"]
FAILS = ('<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", '
         '"message": "savings would drop below the $500 minimum"}}</execution_result>')


def bank_run(mode: str = "real") -> Trace:
    """The savings-minimum task: a balance read that runs, then the trap transfer, rehearsed to fail and
    blocked (real mode); in simulated mode both calls are answered by their rehearsals."""
    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "savings_minimum")
    me = task.initial_state["customer_id"]
    savings = next(a["id"] for a in task.initial_state["accounts"].values() if a["owner"] == me and a["type"] == "savings")
    calls = [("get_balance", {"account_id": savings}), ("transfer", task.trap.arguments)]
    text = "".join(f'<tool_call>{json.dumps({"name": n, "arguments": a})}</tool_call>' for n, a in calls)
    balance = '<execution_result>{"account_id": "%s", "balance": 600.0}</execution_result>' % savings
    policy = ScriptedPolicy(act=[text, "Savings must keep $500."],
                            rehearse=[FAILS] if mode == "real" else [balance, FAILS])

    async def run() -> Trace:
        async with Toolbox({"bank": suite.build_server()}) as toolbox:
            context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(Episode(task, "bank").meta), mode=mode,
                                    gate=GateConfig(require_approval="never", rehearse="all" if mode != "real" else "writes"))
            _, trace = await record_run(create_envace_graph().compile(),
                                        {"messages": [HumanMessage(content=task.instruction)]}, context=context,
                                        task_id=task.id, suite="bank", group_id="g")
        return trace

    trace = anyio.run(run)
    trace.rewards.append(Reward(name="task", value=1.0, details={"checks": ["refused"]}))
    return trace


@pytest.fixture(scope="module")
def recorded() -> Trace:
    return bank_run()


def calls_of(trajectory: dict) -> list[tuple[str, dict, object]]:
    """Every call of a trajectory with its arguments and its reply (None: unanswered), in order."""
    found = []
    for step in trajectory["steps"]:
        replies = {r["source_call_id"]: r.get("content") for r in (step.get("observation") or {}).get("results", [])}
        found += [(c["function_name"], c["arguments"], replies.get(c["tool_call_id"])) for c in step.get("tool_calls", [])]
    return found


def atif_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_recorded_run_is_a_trajectory_the_atif_models_accept(recorded):
    document = to_atif(recorded)
    atif.Trajectory.model_validate(document)
    assert document["schema_version"] == "ATIF-v1.8" and document["session_id"] == recorded.run_id
    agent = document["agent"]
    assert agent["name"] == "envace-mcp" and agent["version"] and agent["model_name"] == recorded.model
    assert [d["function"]["name"] for d in agent["tool_definitions"]] == [t["name"] for t in recorded.tools]
    transfer = next(d for d in agent["tool_definitions"] if d["function"]["name"] == "transfer")
    assert transfer["type"] == "function" and transfer["function"]["parameters"]["properties"]["amount"]
    assert agent["extra"]["tools"]["transfer"]["annotations"]["destructive"] is True

    user, turn, answer = document["steps"]
    assert user == {"step_id": 1, "source": "user", "message": recorded.task, "timestamp": user["timestamp"]}
    assert answer["source"] == "agent" and answer["message"] == recorded.final_answer == "Savings must keep $500."
    tools = {s.call_id: s for s in recorded.steps_of("tool")}
    act = recorded.steps_of("act")[0]
    assert [(c["tool_call_id"], c["function_name"], c["arguments"]) for c in turn["tool_calls"]] == [
        (c["id"], c["name"], c["arguments"]) for c in act.parsed["tool_calls"]]
    for result in turn["observation"]["results"]:  # the reply as the agent saw it
        assert result["content"] == ToolResult.text_of(tools[result["source_call_id"]].result)
    assert "balance" in turn["observation"]["results"][0]["content"]
    for step in document["steps"]:
        assert recorded.started_at - 1 < atif_time(step["timestamp"]) < recorded.ended_at + 1
    assert document["extra"]["rewards"] == [{"name": "task", "value": 1.0, "details": {"checks": ["refused"]}}]
    assert document["extra"]["task_id"] == recorded.task_id and document["extra"]["status"] == "finished"


def test_a_call_the_gate_stopped_is_marked_as_never_run_and_a_simulated_one_too(recorded):
    read, transfer = to_atif(recorded)["steps"][1]["tool_calls"]
    assert read["extra"] == {"ran": True, "decision": "execute", "reason": read["extra"]["reason"]}
    assert transfer["extra"]["ran"] is False and transfer["extra"]["decision"] == "block"
    assert transfer["extra"]["rehearsal"]["status"] == "tool_error" and "$500" in transfer["extra"]["rehearsal"]["message"]
    refusal = to_atif(recorded)["steps"][1]["observation"]["results"][1]
    assert refusal["content"].startswith("Not executed (block)") and refusal["extra"]["is_error"] is True

    simulated = to_atif(bank_run("simulated"))
    assert [(c["extra"]["ran"], c["extra"].get("simulated"), c["extra"]["decision"])
            for c in simulated["steps"][1]["tool_calls"]] == [(False, True, "simulate"), (False, True, "simulate")]


def test_token_ids_and_logprobs_go_out_only_when_asked():
    trace = next(iter(TraceStore(FIXTURES).read()))
    act = trace.steps_of("act")[0]
    plain, tokens = to_atif(trace), to_atif(trace, tokens=True)
    metrics = [s["metrics"] for s in plain["steps"] if "metrics" in s]
    assert metrics[0] == {"prompt_tokens": len(act.prompt_ids), "completion_tokens": len(act.completion_ids)}
    assert plain["final_metrics"]["total_prompt_tokens"] == sum(len(s.prompt_ids) for s in trace.steps_of("act"))
    first = next(s["metrics"] for s in tokens["steps"] if "metrics" in s)
    assert first["prompt_token_ids"] == act.prompt_ids and first["logprobs"] == act.logprobs
    atif.Trajectory.model_validate(tokens)


OTHER = {
    "schema_version": "ATIF-v1.6", "session_id": "other-1",
    "agent": {"name": "other-agent", "version": "2.0", "model_name": "gpt-x", "tool_definitions": [
        {"type": "function", "function": {"name": "lookup", "description": "Find a record.",
                                          "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}},
        {"name": "save", "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}},
         "annotations": {"destructiveHint": True}}]},
    "steps": [
        {"step_id": 1, "source": "system", "message": "You are helpful."},
        {"step_id": 2, "source": "user", "message": "Find r1 and save it.", "timestamp": "2025-10-16T14:30:00Z"},
        {"step_id": 3, "source": "agent", "message": "Looking.", "timestamp": "2025-10-16T14:30:01Z",
         "tool_calls": [{"tool_call_id": "call_0", "function_name": "lookup", "arguments": {"id": "r1"}},
                        {"tool_call_id": "call_1", "function_name": "shout", "arguments": {}}],
         "observation": {"results": [
             {"source_call_id": "call_0", "content": '{"id": "r1", "name": "Ada"}'},
             {"source_call_id": "call_1", "content": "no such tool", "extra": {"is_error": True}}]}},
        {"step_id": 4, "source": "agent", "message": "Saving.", "timestamp": "2025-10-16T14:30:02Z",
         "tool_calls": [{"tool_call_id": "call_0", "function_name": "save", "arguments": {"id": "r1"}},
                        {"tool_call_id": "call_2", "function_name": "save", "arguments": {"id": "r2"},
                         "extra": {"ran": False}}],
         "observation": {"results": [
             {"source_call_id": "call_0", "content": [
                 {"type": "text", "text": "saved"},
                 {"type": "image", "source": {"media_type": "image/png", "path": "shots/r1.png"}}]},
             {"source_call_id": "call_2", "content": "Refused by the operator."}]}},
        {"step_id": 5, "source": "agent", "message": "Saved r1.", "timestamp": "2025-10-16T14:30:03Z"}],
}


def test_atif_to_traces_to_atif_keeps_every_call_its_arguments_and_its_reply(recorded):
    trace = from_atif(OTHER)
    assert trace.task == "Find r1 and save it." and trace.final_answer == "Saved r1." and trace.model == "gpt-x"
    assert trace.run_id == "other-1" and trace.metadata["agent"] == {"name": "other-agent", "version": "2.0"}
    again = to_atif(trace)
    assert calls_of(again) == calls_of(OTHER)
    assert [s["message"] for s in again["steps"]] == [s["message"] for s in OTHER["steps"][1:]]
    ours = to_atif(recorded)
    assert to_atif(from_atif(ours)) == ours  # our own trajectory comes back whole, extras and all
    back = from_atif(ours)
    assert {k: getattr(back, k) for k in ("task_id", "suite", "group_id", "rewards", "gate", "tools")} == \
        {k: getattr(recorded, k) for k in ("task_id", "suite", "group_id", "rewards", "gate", "tools")}


def test_an_imported_trajectory_gives_world_model_fit_the_calls_that_ran(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps([OTHER, {**OTHER, "session_id": "other-2"}]))
    traces, summary = read_atif(path)
    assert [t.run_id for t in traces] == ["other-1", "other-2"]
    assert summary.runs == 2 and summary.calls == 8 and summary.not_run == 2
    assert summary.undefined == {"shout": 2} and summary.skipped == []
    observed, unknown = observed_calls(traces[:1])
    assert [(o.tool, o.request.call.arguments, o.value, o.failed) for o in observed] == [
        ("lookup", {"id": "r1"}, {"id": "r1", "name": "Ada"}, False), ("save", {"id": "r1"}, "saved\n[resource_link: image/png]", False)]
    assert unknown == {"shout": 1}  # its reply is kept, but no definition says what the tool takes
    assert observed[1].spec.annotations.destructive and observed[0].request.call.id != observed[1].request.call.id
    refused = traces[0].steps_of("tool")[-1]
    assert not refused.ran and refused.decision == "reject" and refused.result["error_kind"] is None
    store = TraceStore(tmp_path / "imported")
    for trace in traces:
        store.append(trace)
    runs, calls, _ = read_calls(tmp_path / "imported")  # what `envace world-model fit` reads
    assert len(runs) == 2 and len(calls) == 4 and {c.episode for c in calls} == {"other-1", "other-2"}


def hostile_lines() -> list[bytes]:
    deep: object = "x"
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    escape = json.loads(json.dumps(OTHER))
    escape["steps"][2]["tool_calls"][0]["function_name"] = "look\x1b[2Jup\x1b]0;pwned\x07"
    huge = json.loads(json.dumps(OTHER))
    huge["session_id"] = "huge"
    huge["steps"][2]["observation"]["results"][0]["content"] = "y" * (RESULT_CHARS + 10)
    wrong = json.loads(json.dumps(OTHER))
    wrong["steps"][2]["tool_calls"][0]["arguments"] = "id=r1"
    rows = [json.dumps(OTHER), "not JSON {", "[1, 2]", json.dumps({**OTHER, "steps": "many"}), json.dumps(wrong),
            json.dumps({**OTHER, "extra": {"deep": deep}}),
            json.dumps({**OTHER, "session_id": "s" * 1000}), json.dumps(escape), json.dumps(huge),
            json.dumps({**OTHER, "schema_version": "ATIF-v9"}), json.dumps(OTHER)[:200]]
    return [row.encode() for row in rows]


def test_malformed_and_hostile_trajectories_are_reported_and_skipped(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b"\n".join(hostile_lines()))
    traces, summary = read_atif(path)
    assert [t.run_id for t in traces] == ["other-1", "other-1#2", "huge"]
    why = dict(summary.skipped)
    assert sorted(why) == [2, 3, 4, 5, 6, 7, 10, 11]
    assert why[2].startswith("not JSON") and "not a trajectory object" in why[3]
    assert why[4].startswith("not an ATIF trajectory: steps") and "steps.2.tool_calls.0.arguments" in why[5]
    assert f"nested deeper than {MAX_DEPTH}" in why[6] and "session_id of 1,000 characters" in why[7]
    assert "not ATIF v1" in why[10] and "cut short" in why[11]
    reply = traces[2].steps_of("tool")[0].result
    assert reply["truncated"]["content_chars"] == RESULT_CHARS + 10  # kept as a trace keeps any reply: cut
    assert summary.undefined == {"shout": 3, "look\x1b[2Jup\x1b]0;pwned\x07": 1}
    report = "\n".join(summary.report())
    assert "skipped 8 line(s): line 2: not JSON" in report and "and 3 more" in report


def test_a_line_past_the_size_bound_is_passed_over_unread(tmp_path, monkeypatch):
    import envace_mcp.traces.atif as module

    monkeypatch.setattr(module, "MAX_DOCUMENT_BYTES", 4096)
    big = {**OTHER, "notes": "z" * 8000}
    (tmp_path / "runs.jsonl").write_text(json.dumps(big) + "\n" + json.dumps(OTHER) + "\n")
    traces, summary = read_atif(tmp_path / "runs.jsonl")
    assert len(traces) == 1 and summary.skipped == [(1, "longer than 4,096 bytes")]


def test_a_file_with_nothing_to_import_is_one_clear_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="holds no trajectory"):
        read_atif(tmp_path / "empty.jsonl")
    (tmp_path / "bad.json").write_text('{"schema_version": "ATIF-v1.8"}')
    with pytest.raises(UserError, match=r"trajectory 1: not an ATIF trajectory: agent: Field required"):
        read_atif(tmp_path / "bad.json")
    (tmp_path / "torn.json").write_text('[{"schema_version": ')
    with pytest.raises(UserError, match="torn.json.*not JSON"):
        read_atif(tmp_path / "torn.json")


def test_without_the_atif_package_atif_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "atif", None)
    for call in (lambda: write_atif([], tmp_path / "x.jsonl"), lambda: read_atif(tmp_path / "x.jsonl")):
        with pytest.raises(UserError, match=r"^ATIF trajectories need the atif package: pip install 'envace-mcp\[atif\]'$"):
            call()
    store = TraceStore(tmp_path / "runs")
    store.append(next(iter(TraceStore(FIXTURES).read())))
    program = ("import sys; sys.modules['atif'] = None; import envace_mcp, envace_mcp.traces; from envace_mcp.cli import main; "
               f"main(['traces', 'export', {str(tmp_path / 'runs')!r}, '--format', 'atif', '--out', 'x.jsonl'])")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: ATIF trajectories need the atif package: pip install 'envace-mcp[atif]'"]


def envace(*args: str) -> subprocess.CompletedProcess:
    env = {"COLUMNS": "200", "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([*ENVACE, *args], capture_output=True, text=True, timeout=120, env=env)


def test_envace_traces_export_and_import_atif_through_a_file(recorded, tmp_path):
    store = TraceStore(tmp_path / "runs")
    store.append(recorded)
    for trace in TraceStore(FIXTURES).read():
        store.append(trace)
    out = tmp_path / "runs.jsonl"
    done = envace("traces", "export", str(tmp_path / "runs"), "--format", "atif", "--out", str(out), "--suite", "bank",
                  "--status", "finished")
    assert done.returncode == 0, done.stderr
    lines = out.read_text().splitlines()
    assert f"wrote {len(lines)} run(s)" in done.stdout and len(lines) == 5
    for line in lines:
        atif.Trajectory.model_validate_json(line)
    assert json.loads(lines[0])["session_id"] == recorded.run_id and "prompt_token_ids" not in out.read_text()

    with out.open("ab") as fh:
        fh.write(hostile_lines()[7] + b"\n" + b"not JSON\n")
    done = envace("traces", "import", str(out), "--format", "atif", "--out", str(tmp_path / "back"))
    assert done.returncode == 0, done.stderr
    assert "imported 6 trajectory(ies)" in done.stdout and "line 7: not JSON" in done.stdout
    assert "\x1b" not in done.stdout and "look\\x1b[2Jup" in done.stdout  # shown, never obeyed
    back = list(TraceStore(tmp_path / "back").read())
    assert [calls_of(to_atif(t)) for t in back[:5]] == [calls_of(json.loads(line)) for line in lines]

    done = envace("traces", "import", str(out), "--format", "atif", "--out", str(tmp_path / "x"), "--catalog", str(out))
    assert done.returncode == 2 and "carries its own catalog (agent.tool_definitions)" in done.stderr
    done = envace("traces", "export", str(tmp_path / "runs"), "--format", "atif")
    assert done.returncode == 2 and "--format atif writes a file: give --out FILE" in done.stderr


def test_a_run_of_tool_steps_alone_exports_each_call_as_its_own_turn():
    """Runs imported from tool-call logs (`envace traces import`) hold no act turns: each call is one."""
    reply = ToolResult(tool="lookup", arguments={"id": "r1"}, content=[{"type": "text", "text": "Ada"}])
    trace = Trace(run_id="log", task="Find r1", started_at=1.0, steps=[
        Step(index=i, role="tool", call_id=f"call_{i}", time=1.0 + i, tool="lookup", arguments={"id": "r1"},
             result=reply.model_dump(mode="json")) for i in range(2)])
    document = to_atif(trace)
    assert calls_of(document) == [("lookup", {"id": "r1"}, "Ada")] * 2 and len(document["steps"]) == 3
    assert [s.ran for s in from_atif(document).steps_of("tool")] == [True, True]
