"""Traces: schema round trip, recording graph runs, crash-safe storage, concurrency, exact logprobs."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from langchain_core.messages import HumanMessage

from envace_mcp.envs import Episode, get_suite
from envace_mcp.graph import EnvaceContext, GateConfig, RunLimits, create_envace_graph
from envace_mcp.testing import FunctionPolicy, ScriptedPolicy
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import Comparison, Reward, Step, Trace, TraceStore, record_run
from envace_mcp.traces.schema import json_schema

ROOT = Path(__file__).parent.parent.parent


def full_trace(run_id="r1", **overrides) -> Trace:
    fields = dict(
        run_id=run_id, task_id="bank/test/0001", suite="bank", group_id="g1", mode="mixed", model="m", model_revision="abc",
        adapter="a/dir", sampling={"act": {"temperature": 1.0}}, gate={"rehearse": "writes"},
        rehearsal={"n": 2, "strategy": "parallel"}, task="do it", started_at=1.5, ended_at=2.5, final_answer="ok",
        status="finished", error=None, rewards=[Reward(name="task", value=1.0, details={"checks": [1]})],
        metadata={"k": "v"},
        steps=[
            Step(index=0, role="act", node="agent", time=1.6, prompt_text="p", prompt_ids=[1, 2], completion_ids=[3],
                 logprobs=[-0.5], text="t", parsed={"tool_calls": []}, sampling={"temperature": 1.0}, finish_reason="stop"),
            Step(index=1, role="gate", node="gate", call_id="c", time=1.7, tool="x", arguments={"a": 1}, decision="block",
                 reason="why"),
            Step(index=2, role="tool", node="act", call_id="c", time=1.8, tool="x", arguments={"a": 1},
                 result={"content": [{"type": "text", "text": "r"}], "is_error": False, "structured_content": {"v": 1},
                         "error_kind": None, "latency_s": 0.1}, simulated=True, decision="simulate", reason="mode",
                 comparison=Comparison(score=0.5, status_match=True, mismatches=["v"])),
        ],
    )
    fields.update(overrides)
    return Trace(**fields)


def test_every_field_survives_a_round_trip(tmp_path):
    for compress in (False, True):
        store = TraceStore(tmp_path / str(compress), compress=compress)
        trace = full_trace()
        store.append(trace)
        [back] = list(store.read())
        assert back == trace and store.problems == []


def test_the_checked_in_json_schema_is_generated_from_the_models():
    assert json.loads((ROOT / "docs" / "trace.schema.json").read_text()) == json_schema()


def test_a_version_2_trace_reads_its_gate_in_the_new_shape_with_its_limits_apart():
    from envace_mcp.graph.gate import GateConfig as Gate
    from envace_mcp.traces.schema import SCHEMA_VERSION, read_trace

    old = {"schema_version": 2, "run_id": "old", "started_at": 0.0,
           "gate": {"rehearse": "writes", "block_destructive_on_predicted_failure": True, "max_steps": 6,
                    "max_real_calls": None, "block_destructive_on_unusable_rehearsal": True,
                    "block_repeated_writes": True, "block_repeated_failures": False}}
    trace = read_trace(old)
    assert trace.schema_version == SCHEMA_VERSION and trace.limits == {"max_steps": 6, "max_real_calls": None}
    assert trace.gate == {"rehearse": "writes", "block_destructive_on_predicted_failure": True, "on_unusable": "block",
                          "evidence": ["repeated_writes"]}
    assert Gate(**trace.gate) == Gate(on_unusable="block", evidence=("repeated_writes",))  # a gate one can run again
    assert read_trace({"run_id": "v1", "started_at": 0.0, "gate": {"max_steps": 2}}).limits == {"max_steps": 2}


def test_rewards_attached_later_are_merged_and_filters_stream(tmp_path):
    store = TraceStore(tmp_path)
    for i, (suite, status) in enumerate([("bank", "finished"), ("retail", "failed"), ("bank", "finished")]):
        store.append(full_trace(run_id=f"r{i}", suite=suite, status=status, rewards=[], started_at=10.0 + i,
                                task_id=f"{suite}/test/{i}"))
    store.attach_reward("r0", Reward(name="task", value=1.0))
    store.attach_reward("r2", Reward(name="task", value=0.25, details={"why": "half"}))
    assert [t.run_id for t in store.read(suite="bank")] == ["r0", "r2"]
    assert [t.run_id for t in store.read(status="failed")] == ["r1"]
    assert [t.run_id for t in store.read(reward=("task", 0.5, None))] == ["r0"]
    assert [t.run_id for t in store.read(reward=("task", None, 0.5))] == ["r2"]
    assert [t.run_id for t in store.read(since=11.0, until=11.5)] == ["r1"]
    assert store.get("r2").reward("task").details == {"why": "half"}


@pytest.mark.parametrize("compress", [False, True])
def test_a_torn_tail_is_reported_and_every_earlier_record_read(tmp_path, compress):
    store = TraceStore(tmp_path, compress=compress)
    for i in range(3):
        store.append(full_trace(run_id=f"r{i}"))
    data = store.path.read_bytes()
    store.path.write_bytes(data + data[: len(data) // 5])  # a crash in the middle of a 4th record
    assert [t.run_id for t in store.read()] == ["r0", "r1", "r2"]
    assert len(store.problems) == 1 and "torn" in store.problems[0]


def test_a_corrupt_line_is_skipped_and_reported(tmp_path):
    store = TraceStore(tmp_path)
    store.append(full_trace(run_id="a"))
    with open(store.path, "ab") as fh:
        fh.write(b'{"kind":"trace","run_id": oops}\n')
    store.append(full_trace(run_id="b"))
    assert [t.run_id for t in store.read()] == ["a", "b"] and "unreadable line" in store.problems[0]


@pytest.mark.parametrize("compress", [False, True])
def test_kill_9_of_a_writer_mid_stream_leaves_every_complete_record_readable(tmp_path, compress):
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_traces import full_trace
        from envace_mcp.traces import Step, TraceStore
        store = TraceStore({str(tmp_path / "store")!r}, compress={compress})
        big = [Step(index=i, role="act", time=0.0, prompt_ids=list(range(3000)), text="x" * 2000) for i in range(20)]
        i = 0
        while True:
            store.append(full_trace(run_id=f"run-{{i}}", steps=big))
            i += 1
    """))
    proc = subprocess.Popen([sys.executable, str(script)])
    store = TraceStore(tmp_path / "store", compress=compress)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not store.path.exists() or store.path.stat().st_size < 3_000_000):
            time.sleep(0.02)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    traces = list(store.read())
    assert len(traces) >= 5
    assert [t.run_id for t in traces] == [f"run-{i}" for i in range(len(traces))]
    assert all(len(t.steps) == 20 and t.steps[-1].prompt_ids[-1] == 2999 for t in traces)
    assert len(store.problems) <= 1  # at most the record the kill cut


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _ids(task):
    me = task.initial_state["customer_id"]
    return {a["type"]: a["id"] for a in task.initial_state["accounts"].values() if a["owner"] == me}


@pytest.mark.anyio
async def test_a_graph_run_is_recorded_step_by_step(tmp_path):
    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "transfer_funds")
    transfer = next(a for a in task.actions if a.tool == "transfer")
    policy = ScriptedPolicy(
        act=[f'<tool_call>{{"name": "transfer", "arguments": {json.dumps(transfer.arguments)}}}</tool_call>', "Done."],
        rehearse=["<execution_result>" + json.dumps({"transfer_id": "T", **transfer.arguments, "from_balance": 1,
                                                     "to_balance": 2}) + "</execution_result>"],
    )
    store = TraceStore(tmp_path)
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(Episode(task, "bank").meta),
                                gate=GateConfig(require_approval="never"))
        state, trace = await record_run(create_envace_graph().compile(),
                                        {"messages": [HumanMessage(content=task.instruction)]}, context=context,
                                        store=store, task_id=task.id, suite="bank", group_id="g")
    assert [s.role for s in trace.steps] == ["act", "rehearse", "gate", "tool", "act"]
    act, rehearse, gate, tool, final = trace.steps
    assert act.parsed["tool_calls"][0]["name"] == "transfer" and act.text.startswith("<tool_call>")
    assert rehearse.parsed["status"] == "result" and rehearse.call_id == gate.call_id == tool.call_id
    assert gate.decision == "execute" and tool.result["is_error"] is False and not tool.simulated
    assert 0 < tool.comparison.score < 1 and "from_balance" in tool.comparison.mismatches
    assert trace.final_answer == "Done." and trace.status == "finished" and trace.mode == "real"
    assert trace.gate["rehearse"] == "writes" and trace.task == task.instruction
    assert [t.run_id for t in store.read()] == [trace.run_id]


@pytest.mark.anyio
async def test_a_crashing_run_still_leaves_a_trace_marked_failed(tmp_path):
    def broken(request):
        raise RuntimeError("model server went away")

    store = TraceStore(tmp_path)
    with pytest.raises(RuntimeError, match="went away"):
        await record_run(create_envace_graph().compile(), {"messages": [HumanMessage(content="hi")]},
                         context=EnvaceContext(policy=FunctionPolicy(act=broken), tools=[], mode="simulated"),
                         store=store)
    [trace] = list(store.read())
    assert trace.status == "failed" and "went away" in trace.error


@pytest.mark.anyio
async def test_an_interrupted_run_is_marked_interrupted(tmp_path):
    from langgraph.checkpoint.memory import InMemorySaver

    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "transfer_funds")
    transfer = next(a for a in task.actions if a.tool == "transfer")
    policy = ScriptedPolicy(act=[f'<tool_call>{{"name": "transfer", "arguments": {json.dumps(transfer.arguments)}}}'
                                 "</tool_call>"], rehearse=["<execution_result>{\"x\": 1}</execution_result>"])
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(Episode(task, "bank").meta),
                                gate=GateConfig(require_approval="always"))
        _, trace = await record_run(create_envace_graph().compile(checkpointer=InMemorySaver()),
                                    {"messages": [HumanMessage(content=task.instruction)]}, context=context,
                                    config={"configurable": {"thread_id": "x"}})
    assert trace.status == "interrupted" and trace.steps[-1].role == "gate" and trace.steps[-1].decision == "ask"


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["inprocess", "http"])
async def test_fifty_concurrent_runs_record_without_mixing_steps(tmp_path, transport):
    suite = get_suite("bank")
    tasks = [t for t in suite.split("train") if t.kind == "balance_inquiry"][:10] * 5

    def act(request):
        if request.messages:
            return "Answered."
        account = request.task.split("account ")[1].rstrip("?")
        return f'<tool_call>{{"name": "get_balance", "arguments": {{"account_id": "{account}"}}}}</tool_call>'

    store = TraceStore(tmp_path)
    graph = create_envace_graph().compile()
    with suite.servers(transport) as servers:  # over http: one streamable-HTTP server for all 50
        async with Toolbox(servers) as toolbox:
            async def one(i, task):
                context = EnvaceContext(policy=FunctionPolicy(act=act),
                                        toolbox=toolbox.scoped(Episode(task, "bank").meta))
                await record_run(graph, {"messages": [HumanMessage(content=task.instruction)]}, context=context,
                                 store=store, task_id=task.id, group_id=f"g{i}")

            async with anyio.create_task_group() as tg:
                for i, task in enumerate(tasks):
                    tg.start_soon(one, i, task)
    traces = list(store.read())
    assert len(traces) == 50 and store.problems == []
    by_task = {t.id: t for t in tasks}
    for trace in traces:
        task = by_task[trace.task_id]
        tool = next(s for s in trace.steps if s.role == "tool")
        account = task.actions[0].arguments["account_id"]
        assert tool.arguments == {"account_id": account}
        assert tool.result["structured_content"]["balance"] == task.initial_state["accounts"][account]["balance"]
        assert [s.index for s in trace.steps] == list(range(len(trace.steps)))


@pytest.mark.anyio
async def test_a_recorded_run_of_the_embedded_model_rescores_to_the_same_logprobs(tmp_path):
    from envace_mcp.policy import SamplingParams, load_policy

    policy = load_policy(role_sampling={"act": SamplingParams(max_new_tokens=12, seed=3)})
    suite = get_suite("bank")
    task = suite.split("test")[0]
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(Episode(task, "bank").meta),
                                limits=RunLimits(max_steps=1), sampling=policy.role_sampling)
        _, trace = await record_run(create_envace_graph().compile(),
                                    {"messages": [HumanMessage(content=task.instruction)]}, context=context,
                                    store=TraceStore(tmp_path))
    [stored] = list(TraceStore(tmp_path).read())
    generations = [s for s in stored.steps if s.prompt_ids]
    assert generations and stored.model == "SmolLM2-135M-Instruct (embedded)"
    for step in generations:
        fresh = policy.score(step.prompt_ids, step.completion_ids, temperature=step.sampling["temperature"])
        assert max(abs(a - b) for a, b in zip(fresh, step.logprobs)) < 1e-4
        assert policy.tokenizer.decode(step.prompt_ids) == step.prompt_text


@pytest.mark.anyio
async def test_a_hand_built_graph_with_the_drop_in_tool_node_is_recorded(tmp_path):
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    from envace_mcp.graph.tool_node import RehearsingToolNode

    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "savings_minimum")
    turns = iter([AIMessage(content="", tool_calls=[{"name": "transfer", "args": task.trap.arguments, "id": "c1"}]),
                  AIMessage(content="Refused.")])
    policy = ScriptedPolicy(rehearse=['<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", '
                                      '"message": "below minimum"}}</execution_result>'])

    async def agent(state: MessagesState):
        return {"messages": [next(turns)]}

    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent)
        builder.add_node("tools", RehearsingToolNode(toolbox.scoped(Episode(task, "bank").meta), policy,
                                                     gate=GateConfig(require_approval="never")))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        _, trace = await record_run(builder.compile(), {"messages": [HumanMessage(content=task.instruction)]})
    assert [s.role for s in trace.steps] == ["act", "rehearse", "gate", "tool", "act"]
    assert trace.steps[0].prompt_ids is None and trace.steps[0].parsed["tool_calls"][0]["name"] == "transfer"
    assert trace.steps[1].parsed["code"] == "EXECUTION_ERROR" and trace.steps[2].decision == "block"
    assert trace.steps[3].result["is_error"] and trace.final_answer == "Refused."


def test_stored_runs_export_to_a_datasets_dataset(tmp_path):
    from envace_mcp.traces import to_dataset

    store = TraceStore(tmp_path)
    for i in range(3):
        store.append(full_trace(run_id=f"r{i}", suite="bank" if i < 2 else "retail"))
    dataset = to_dataset(store, suite="bank")
    assert dataset.num_rows == 2 and set(dataset["run_id"]) == {"r0", "r1"}
    assert json.loads(dataset[0]["steps"])[2]["comparison"]["score"] == 0.5


def test_the_checked_in_fixtures_load_for_the_trainer():
    fixtures = TraceStore(ROOT / "tests" / "fixtures" / "traces")
    traces = list(fixtures.read())
    assert fixtures.problems == [] and len(traces) >= 4
    assert {t.status for t in traces} == {"finished"} and {t.suite for t in traces} == {"bank"}
    assert {t.reward("task").value for t in traces} == {0.0, 1.0}  # a group with something to learn
    groups = {}
    for t in traces:
        groups.setdefault(t.group_id, []).append(t)
    assert any(len(g) >= 2 for g in groups.values())
    with_tokens = [s for t in traces for s in t.steps if s.prompt_ids]
    assert with_tokens and all(len(s.logprobs) == len(s.completion_ids) for s in with_tokens)
    assert all(t.reward("task") is not None for t in traces)


@pytest.mark.anyio
async def test_reference_solutions_replayed_through_the_graph_score_one_with_exact_tokens(tiny_policy):
    from envace_mcp.envs.reference import reference_roles
    from envace_mcp.policy.forced import ForcedPolicy

    results = []
    for name in ("bank", "retail"):
        suite = get_suite(name)
        tasks = [t for t in suite.split("test") if len(t.actions) >= 3][:2] + [next(t for t in suite.tasks if t.trap)]
        async with Toolbox({name: suite.build_server()}) as toolbox:
            for task in tasks:
                episode = Episode(task, name)
                policy = ForcedPolicy(tiny_policy, **reference_roles(suite, task))
                context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta), gate=GateConfig(rehearse="all", require_approval="never"))
                state, trace = await record_run(create_envace_graph().compile(),
                                                {"messages": [HumanMessage(content=task.instruction)]}, context=context)
                verdict = suite.check(task, await episode.final_state(toolbox), state["final_answer"])
                results.append((task.id, verdict.score))
                fidelity = [s.comparison.score for s in trace.steps if s.comparison is not None]
                assert fidelity and min(fidelity) == 1.0  # the reference simulator predicts reality exactly
                for step in trace.steps:
                    if step.prompt_ids:
                        rescored = tiny_policy.score(step.prompt_ids, step.completion_ids)
                        assert max(abs(a - b) for a, b in zip(rescored, step.logprobs)) < 1e-4
    assert all(score == 1.0 for _, score in results), results


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    from envace_mcp.policy import load_policy
    from envace_mcp.testing import build_tiny_qwen3

    return load_policy(str(build_tiny_qwen3(tmp_path_factory.mktemp("tiny"))))


def test_traces_cli_lists_shows_and_summarises_runs(tmp_path):
    fixtures = ROOT / "tests" / "fixtures" / "traces"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "envace_mcp.cli", *args], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "COLUMNS": "200"})

    listed = cli("traces", "ls", str(fixtures))
    assert listed.returncode == 0 and sorted(set(re.findall(r"fixture-\d", listed.stdout))) == [f"fixture-{i}" for i in range(4)]
    shown = cli("traces", "show", "fixture-0", "--dir", str(fixtures))
    assert shown.returncode == 0 and "rehearsed:" in shown.stdout and "(matched)" in shown.stdout
    stats = cli("traces", "stats", str(fixtures))
    assert stats.returncode == 0 and "50.0%" in stats.stdout and "1.000 over 2 executed calls" in stats.stdout
    assert re.search(r"fields echoed from the call\s+│ 1\.000 of \d+", stats.stdout)  # the world model by kind of field
    missing = cli("traces", "ls", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "traces.jsonl").write_bytes((fixtures / "traces.jsonl").read_bytes()[:-500])
    partial = cli("traces", "stats", str(torn))
    assert partial.returncode == 0 and "3 runs" in partial.stdout and "torn tail" in partial.stdout
