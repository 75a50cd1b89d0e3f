"""graphs/langgraph.json: the served graph loads without starting anything; servers start on first run."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from envace_mcp.eval import get_suite
from envace_mcp.graph.served import close_shared
from envace_mcp.testing import ScriptedPolicy
from helpers import PROBE, children_of, wait_until

pytestmark = pytest.mark.anyio
GRAPHS = Path(__file__).parent.parent.parent / "graphs"


def load_served_graph():
    spec = importlib.util.spec_from_file_location("envace_served_graph", GRAPHS / "envace_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as LangGraph's loader does; dataclasses need it
    spec.loader.exec_module(module)
    return module


def test_langgraph_json_names_the_graph_module():
    config = json.loads((GRAPHS / "langgraph.json").read_text())
    path, _, attribute = config["graphs"]["envace"].partition(":")
    assert (GRAPHS / path).exists() and attribute == "graph"


async def test_reading_the_graph_starts_no_server_and_the_first_run_does(tmp_path, monkeypatch):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"probe": {"command": sys.executable, "args": [PROBE]}}}))
    monkeypatch.setenv("ENVACE_SERVERS", str(config))
    before = children_of(os.getpid())
    module = load_served_graph()
    graph = module.graph
    graph.get_graph().draw_mermaid()
    graph.get_input_jsonschema()
    graph.get_context_jsonschema()
    assert children_of(os.getpid()) == before  # nothing started by reading
    policy = ScriptedPolicy(act=['<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>', "done"])
    try:
        context = module.ServedContext(policy=policy)
        assert context.servers == str(config)
        out = await graph.ainvoke({"messages": [HumanMessage(content="say hi")]}, context=context)
        assert out["final_answer"] == "done" and out["real_calls"] == 1
        assert len(children_of(os.getpid()) - before) >= 1  # the probe server runs now
    finally:
        close_shared()
    assert wait_until(lambda: children_of(os.getpid()) == before)


async def test_the_gate_arrives_as_json_settings_and_a_bad_one_fails_before_anything_starts(tmp_path, monkeypatch):
    """A served run's context is JSON: its gate is a dict of GateConfig settings, not a GateConfig."""
    from envace_mcp.errors import UserError

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"probe": {"command": sys.executable, "args": [PROBE]}}}))
    monkeypatch.setenv("ENVACE_SERVERS", str(config))
    graph = load_served_graph().graph
    call = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
    before = children_of(os.getpid())
    try:
        for gate, says in [({"max_steps": 0}, "the context's gate: max_steps must be a whole number of at least 1, not 0"),
                           ({"colour": "red"}, "the context's gate: unknown setting 'colour'; known: rehearse, "),
                           (["max_steps"], "must be an object")]:
            with pytest.raises(UserError, match=says):
                await graph.ainvoke({"messages": [HumanMessage(content="say hi")]},
                                    context={"policy": ScriptedPolicy(act=[call]), "gate": gate})
        assert children_of(os.getpid()) == before  # no server started for a bad gate
        out = await graph.ainvoke({"messages": [HumanMessage(content="say hi")]},
                                  context={"policy": ScriptedPolicy(act=[call, call, "done"]), "gate": {"max_steps": 1}})
        assert out["status"] == "max_steps" and out["real_calls"] == 1  # one agent turn, as the JSON said
    finally:
        close_shared()


def test_a_served_context_starts_from_the_gate_its_adapter_recommends_and_its_own_settings_win(tmp_path, tiny_qwen3_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from envace_mcp.graph import GateConfig
    from envace_mcp.graph.served import ServedContext

    adapter = tmp_path / "adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir), LoraConfig(r=2, target_modules=["q_proj"])
                   ).save_pretrained(adapter)
    (adapter / "envace.json").write_text(json.dumps({"gate": {"block_destructive_on_unusable_rehearsal": True,
                                                              "rehearse": "all"}}))
    try:
        gate = ServedContext(model=str(tiny_qwen3_dir), adapter=str(adapter), gate={"rehearse": "none"}).load().gate
        assert gate == GateConfig(block_destructive_on_unusable_rehearsal=True, rehearse="none")
        assert ServedContext(model=str(tiny_qwen3_dir), adapter="none").load().gate == GateConfig()
        chosen = GateConfig(max_steps=2)  # a GateConfig given in Python is used as it is
        assert ServedContext(model=str(tiny_qwen3_dir), adapter=str(adapter), gate=chosen).load().gate is chosen
        given = ServedContext(policy=ScriptedPolicy(act=["done"]), adapter=str(adapter)).load().gate
        assert given == GateConfig()  # the adapter named does not describe a policy given as an object
        world = tmp_path / "world"  # a world model of its own: its recommendation, and it rehearses
        get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir), LoraConfig(r=2, target_modules=["q_proj"])
                       ).save_pretrained(world)
        (world / "envace.json").write_text(json.dumps({"gate": {"min_failure_confidence": 0.6}}))
        served = ServedContext(model=str(tiny_qwen3_dir), adapter=str(adapter), rehearse_adapter=str(world)).load()
        assert served.gate == GateConfig(min_failure_confidence=0.6)
        assert served.policy.name == f"{tiny_qwen3_dir} + rehearse adapter {world}"
    finally:
        close_shared()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_langgraph_dev_serves_the_graph_and_a_run_over_its_http_api_completes_without_allow_blocking(tmp_path):
    """`cd graphs && langgraph dev`, as a LangGraph user runs it: the default model (the embedded one with
    the shipped adapter) and the bundled servers load on the first run, off the server's event loop."""
    import signal
    import subprocess
    import urllib.request

    from envace_mcp.eval.suites import free_port, wait_for_port

    import shutil

    langgraph = Path(sys.executable).parent / "langgraph"
    assert langgraph.exists(), "langgraph-cli[inmem] is a test dependency (pip install -e '.[test]')"
    served = tmp_path / "graphs"  # a copy: the dev server keeps its state in .langgraph_api/ beside the config
    shutil.copytree(GRAPHS, served, ignore=shutil.ignore_patterns(".langgraph_api", "__pycache__"))
    port = free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false", "HF_HUB_OFFLINE": "1"}
    env.pop("ENVACE_SERVERS", None)
    log = open(tmp_path / "langgraph-dev.log", "wb")
    server = subprocess.Popen([str(langgraph), "dev", "--port", str(port), "--no-browser", "--no-reload"],
                              cwd=served, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, server, 120)
        question = get_suite("bank").split("test")[0].instruction  # `envace demo`'s task, phrased as trained
        body = {"assistant_id": "envace", "input": {"messages": [{"role": "user", "content": question}]}}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/runs/wait", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=800) as response:
            out = json.loads(response.read())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
    logged = (tmp_path / "langgraph-dev.log").read_text(errors="replace")
    assert "__error__" not in out, logged[-3000:]
    assert "BlockingError" not in logged
    assert out["status"] in ("finished", "max_steps") and out["steps"] >= 1
    # the shipped adapter makes the embedded model call tools (the bare model never does)
    assert any(m.get("tool_calls") for m in out["messages"] if m["type"] == "ai"), out["messages"]
    assert out["rehearsals"] and any(r.get("real") for r in out["rehearsals"])  # a real MCP server answered
