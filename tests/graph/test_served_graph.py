"""graphs/langgraph.json: the served graph loads without starting anything; servers start on first run."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from envace_mcp.graph.state import close_shared
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
