"""LangSmith: traced runs show rehearse, gate and act as named steps (checked against a local server
posing as the LangSmith endpoint, tracing turned on by its environment variables in a fresh process as
a user's would be), and recorded runs go to a dataset file and come back."""

from __future__ import annotations

import email.parser
import email.policy
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envace_mcp.errors import UserError
from envace_mcp.traces import Reward, TraceStore
from envace_mcp.traces.langsmith import TOKEN_FIELDS, read_examples, to_example, write_examples

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
ENVACE = [sys.executable, "-m", "envace_mcp.cli"]

# The three ways a user runs EnvACE under LangGraph, each its own root run: the EnvACE graph, a hand-built
# graph with RehearsingToolNode, create_agent with RehearsalMiddleware. One read-only call (not rehearsed,
# runs) and the task's trap transfer (rehearsed to fail, blocked) in one turn.
PROGRAM = r'''
import asyncio, json
from typing import Any
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tracers.langchain import wait_for_all_tracers
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langchain.agents import create_agent
from envace_mcp.envs import Episode, get_suite
from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.graph.middleware import RehearsalMiddleware
from envace_mcp.graph.tool_node import RehearsingToolNode
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox

FAILS = ('<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", '
         '"message": "savings would drop below the $500 minimum"}}</execution_result>')
NEVER = GateConfig(require_approval="never")

class ToolCallingFake(BaseChatModel):
    """Scripted replies kept in a list: a traced run serializes the model, and an iterator would be used up."""
    replies: list
    @property
    def _llm_type(self) -> str:
        return "scripted"
    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.replies.pop(0))])
    def bind_tools(self, tools: Any, **kwargs: Any) -> "ToolCallingFake":
        return self

suite = get_suite("bank")
task = next(t for t in suite.split("test") if t.kind == "savings_minimum")
me = task.initial_state["customer_id"]
savings = next(a["id"] for a in task.initial_state["accounts"].values() if a["owner"] == me and a["type"] == "savings")
calls = [("get_balance", {"account_id": savings}), ("transfer", task.trap.arguments)]

def model():
    turn = AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"c{i}"} for i, (n, a) in enumerate(calls)])
    return ToolCallingFake(replies=[turn, AIMessage(content="Savings must keep $500.")])

async def main():
    text = "".join(f'<tool_call>{json.dumps({"name": n, "arguments": a})}</tool_call>' for n, a in calls)
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        episode = Episode(task, "bank")
        policy = ScriptedPolicy(act=[text, "Savings must keep $500."], rehearse=[FAILS])
        await create_envace_graph().compile().ainvoke(
            {"messages": [HumanMessage(content=task.instruction)]}, {"run_name": "envace-graph"},
            context=EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta), gate=NEVER))

        agent_model = model()
        async def call_model(state: MessagesState):
            return {"messages": [await agent_model.ainvoke(state["messages"])]}
        builder = StateGraph(MessagesState)
        builder.add_node("agent", call_model)
        builder.add_node("tools", RehearsingToolNode(toolbox.scoped(episode.meta), ScriptedPolicy(rehearse=[FAILS]),
                                                     gate=NEVER))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        await builder.compile().ainvoke({"messages": [HumanMessage(content=task.instruction)]},
                                        {"run_name": "tool-node-graph"})

        tools = toolbox.langchain_tools(meta=episode.meta)
        agent = create_agent(model(), tools=tools,
                             middleware=[RehearsalMiddleware(ScriptedPolicy(rehearse=[FAILS]), tools=tools, gate=NEVER)])
        await agent.ainvoke({"messages": [HumanMessage(content=task.instruction)]}, {"run_name": "agent-graph"})

asyncio.run(main())
wait_for_all_tracers()
'''


class LangSmithStandIn(BaseHTTPRequestHandler):
    """The endpoints the langsmith client posts traced runs to: multipart ingest, and the JSON batch and
    single-run ones it falls back to. Every run operation is kept as (operation, run fields)."""

    operations: list[tuple[str, dict]]

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply(200, {} if self.path.startswith("/info") else {"detail": "not found"})

    def _body(self) -> bytes:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "zstd":
            import zstandard

            body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        return body

    def do_POST(self) -> None:
        body = self._body()
        if self.path.startswith("/runs/multipart"):
            self.operations.extend(multipart_runs(self.headers["Content-Type"], body))
        elif self.path.startswith("/runs/batch"):
            batch = json.loads(body)
            self.operations.extend((op, run) for op in ("post", "patch") for run in batch.get(op) or [])
        elif self.path.rstrip("/") == "/runs":
            self.operations.append(("post", json.loads(body)))
        self._reply(202, {})

    def do_PATCH(self) -> None:
        run = json.loads(self._body())
        self.operations.append(("patch", {"id": self.path.rsplit("/", 1)[-1], **run}))
        self._reply(202, {})


def multipart_runs(content_type: str, body: bytes) -> Iterator[tuple[str, dict]]:
    """The run operations of one multipart ingest request: a `post.<id>` / `patch.<id>` part with the run,
    and `post.<id>.inputs` / `.outputs` parts with those fields."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    runs: dict[tuple[str, str], dict] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        operation, run_id, *field = name.split(".")
        if operation not in ("post", "patch"):
            continue
        value = json.loads(part.get_payload(decode=True))
        run = runs.setdefault((operation, run_id), {"id": run_id})
        run.update({field[0]: value} if field else value)
    yield from ((operation, run) for (operation, _), run in runs.items())


@pytest.fixture
def langsmith_endpoint() -> Iterator[tuple[str, list]]:
    operations: list[tuple[str, dict]] = []
    handler = type("Handler", (LangSmithStandIn,), {"operations": operations})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", operations
    finally:
        server.shutdown()
        server.server_close()


def merged(operations: list[tuple[str, dict]]) -> dict[str, dict]:
    """Each run as posted, then patched (its end, outputs, error)."""
    runs: dict[str, dict] = {}
    for operation, run in operations:
        runs.setdefault(str(run["id"]), {}).update({k: v for k, v in run.items() if v is not None})
    return runs


def subtree(runs: dict[str, dict], root: str) -> dict[str, dict]:
    """The root's run and every run under it."""
    children: dict[str, list[str]] = {}
    for run_id, run in runs.items():
        children.setdefault(str(run.get("parent_run_id")), []).append(run_id)
    found, frontier = {}, [root]
    while frontier:
        run_id = frontier.pop()
        found[run_id] = runs[run_id]
        frontier += children.get(run_id, [])
    return found


def test_traced_runs_show_rehearse_gate_and_act_as_named_steps(langsmith_endpoint, tmp_path):
    url, operations = langsmith_endpoint
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGSMITH_", "LANGCHAIN_"))}
    env.update(LANGSMITH_TRACING="true", LANGSMITH_ENDPOINT=url, LANGSMITH_API_KEY="test", LANGSMITH_PROJECT="envace")
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = merged(operations)
    roots = {run["name"]: run_id for run_id, run in runs.items() if not run.get("parent_run_id")}
    assert {"envace-graph", "tool-node-graph", "agent-graph"} <= set(roots)

    def named(tree: dict[str, dict], name: str) -> list[dict]:
        return [run for run in tree.values() if run["name"] == name]

    # the EnvACE graph: its nodes are the steps, one act task per call
    graph = subtree(runs, roots["envace-graph"])
    for step, count in (("rehearse", 1), ("gate", 1), ("act", 2)):
        assert len(named(graph, step)) == count and all(r["parent_run_id"] == roots["envace-graph"] for r in named(graph, step))

    # the drop-ins: each call's rehearse, gate and act are children of what runs the call (the tool node;
    # create_agent's per-call tools task, through the middleware's wrapper); the real tool's own run is a
    # child of act, and a blocked call's act ran nothing
    for root, rehearsed_in in (("tool-node-graph", "tools"), ("agent-graph", "RehearsalMiddleware.after_model")):
        tree = subtree(runs, roots[root])
        wrappers = {r["id"] for name in ("tools", "RehearsalMiddleware.awrap_tool_call") for r in named(tree, name)}
        gates = {r["inputs"]["call"]["name"]: r for r in named(tree, "gate")}
        acts = {r["inputs"]["call"]["name"]: r for r in named(tree, "act")}
        assert set(gates) == set(acts) == {"get_balance", "transfer"}, root
        for call in gates:
            assert gates[call]["parent_run_id"] == acts[call]["parent_run_id"] in wrappers, (root, call)
        assert {call: gate["outputs"]["decision"]["action"] for call, gate in gates.items()} == \
            {"get_balance": "execute", "transfer": "block"}
        assert acts["get_balance"]["outputs"]["ran"] is True and acts["transfer"]["outputs"]["ran"] is False
        assert [r["parent_run_id"] for r in named(tree, "get_balance")] == [acts["get_balance"]["id"]], root
        assert not named(tree, "transfer")  # the blocked call never reached a tool
        rehearsals = named(tree, "rehearse")
        assert rehearsals and {r["parent_run_id"] for r in rehearsals} <= wrappers | {r["id"] for r in named(tree, rehearsed_in)}
        predictions = [p for r in rehearsals for p in r["outputs"].get("predictions", [r["outputs"].get("prediction")])]
        assert any(p and p["status"] == "tool_error" for p in predictions), root
        assert all(not r.get("error") for r in tree.values())


def test_named_steps_cost_nothing_and_post_nothing_with_tracing_off(monkeypatch):
    from langsmith.run_helpers import tracing_context

    from envace_mcp.traces.langsmith import named_step

    with tracing_context(enabled=False), named_step("gate", call={"name": "x"}) as step:
        step.done(decision="execute")
    assert step.run is None


# ---------------------------------------------------------------------------- dataset examples


def fixture_traces():
    store = TraceStore(FIXTURES)
    return list(store.read())


def without_tokens(trace):
    data = trace.model_dump(mode="json")
    for step in data["steps"]:
        for key in TOKEN_FIELDS:
            step[key] = None
    return data


def test_recorded_runs_go_to_a_dataset_file_and_come_back_whole_but_for_their_tokens(tmp_path):
    traces = fixture_traces()
    traces[0].rewards.append(Reward(name="judge", value=None, details={"unscorable": True}))
    out = tmp_path / "runs.jsonl"
    assert write_examples(traces, out) == len(traces)
    lines = out.read_text().splitlines()
    example = json.loads(lines[0])
    assert set(example) == {"inputs", "outputs", "metadata"}  # the fields Client.create_examples takes
    assert example["inputs"]["task"] == traces[0].task and example["metadata"]["run_id"] == traces[0].run_id
    assert "prompt_ids" not in json.dumps(example) and example["outputs"]["final_answer"] == traces[0].final_answer
    back, summary = read_examples(out)
    assert [without_tokens(t) for t in back] == [without_tokens(t) for t in traces]
    assert summary.skipped == [] and summary.runs == len(traces)
    write_examples(traces, tmp_path / "tokens.jsonl", tokens=True)
    with_tokens, _ = read_examples(tmp_path / "tokens.jsonl")
    assert [t.model_dump() for t in with_tokens] == [t.model_dump() for t in traces]


def test_the_examples_upload_with_the_langsmith_client_as_they_are(tmp_path):
    from langsmith.schemas import ExampleCreate

    write_examples(fixture_traces()[:1], tmp_path / "runs.jsonl")
    example = json.loads((tmp_path / "runs.jsonl").read_text())
    created = ExampleCreate(inputs=example["inputs"], reference_outputs=example["outputs"], metadata=example["metadata"])
    assert created.model_dump(by_alias=True)["outputs"] == example["outputs"]


def test_a_malformed_line_is_reported_by_number_and_a_torn_tail_skipped(tmp_path):
    traces = fixture_traces()[:2]
    good = [json.dumps(to_example(t)) for t in traces]
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join([good[0], "not JSON", "[1, 2]", '{"inputs": {}, "outputs": {}, "metadata": {}}',
                               json.dumps({"inputs": [], "outputs": {}}), "", good[1], good[1][: len(good[1]) // 2]]))
    back, summary = read_examples(path)
    assert [t.run_id for t in back] == [t.run_id for t in traces]
    skipped = dict(summary.skipped)
    assert sorted(skipped) == [2, 3, 4, 5, 8]
    assert skipped[2].startswith("not JSON") and "not an example object" in skipped[3]
    assert "metadata lacks run_id, started_at" in skipped[4] and "'inputs' is a JSON list" in skipped[5]
    assert "cut short" in skipped[8]
    assert any("skipped 5 line(s): line 2: not JSON" in line for line in summary.report())


def test_a_bad_step_is_named_and_a_file_with_no_run_is_one_clear_error(tmp_path):
    example = to_example(fixture_traces()[0])
    example["outputs"]["steps"][0]["role"] = "dance"
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(example) + "\n")
    with pytest.raises(UserError, match=r"no run to import .*line 1: not a trace: steps\.0\.role"):
        read_examples(path)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(UserError, match="it is empty"):
        read_examples(tmp_path / "empty.jsonl")


def test_envace_traces_export_and_import_round_trip_a_folder_through_a_dataset_file(tmp_path):
    store = TraceStore(tmp_path / "runs")
    for trace in fixture_traces():
        store.append(trace)
    dataset = tmp_path / "runs.jsonl"
    done = subprocess.run([*ENVACE, "traces", "export", str(tmp_path / "runs"), "--format", "langsmith",
                           "--out", str(dataset)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote 4 run(s)" in done.stdout
    with dataset.open("a") as fh:
        fh.write("not JSON\n")
    done = subprocess.run([*ENVACE, "traces", "import", str(dataset), "--format", "langsmith",
                           "--out", str(tmp_path / "back")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "imported 4 run(s)" in done.stdout and "line 5: not JSON" in done.stdout
    assert [without_tokens(t) for t in TraceStore(tmp_path / "back").read()] == [without_tokens(t) for t in fixture_traces()]
    done = subprocess.run([*ENVACE, "traces", "import", str(dataset), "--format", "langsmith", "--out",
                           str(tmp_path / "x"), "--catalog", str(dataset)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "carries its own catalog" in done.stderr


def test_a_run_too_deep_to_serialise_is_left_out_of_the_examples_with_why_and_the_rest_are_written(tmp_path):
    """A tool's reply nested past what serialisation allows (a trace file is untrusted) costs that run,
    named and said why, not the export."""
    deep: object = "x"
    for _ in range(600):
        deep = [deep]
    folder = tmp_path / "runs"
    folder.mkdir()
    base = {"kind": "trace", "schema_version": 3, "started_at": 1.0, "ended_at": 2.0, "task": "t", "status": "finished"}
    lines = [dict(base, run_id="deep\x1b[2J", steps=[{"index": 0, "role": "tool", "call_id": "c1", "time": 1.2,
                                                      "tool": "x", "arguments": {}, "result": {"value": deep}}]),
             dict(base, run_id="plain", steps=[])]
    (folder / "traces.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    skipped: list[str] = []
    count = write_examples(list(TraceStore(folder).read()), tmp_path / "runs.jsonl", skipped=skipped)
    assert count == 1 and [json.loads(l)["metadata"]["run_id"] for l in open(tmp_path / "runs.jsonl")] == ["plain"]
    assert len(skipped) == 1 and "deep" in skipped[0]
