"""The catalog as LangChain tools, inside real LangChain / LangGraph machinery."""

import threading

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from envace_mcp.servers import bank
from envace_mcp.toolbox import Toolbox, blocking_toolbox
from probe_server import build

pytestmark = pytest.mark.anyio

RESERVED = {"runtime": "prod", "config": {"depth": 2}, "callbacks": ["a", "b"], "run_manager": "rm-7"}


def call(name: str, args: dict, call_id: str = "call-1") -> dict:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


async def test_reserved_parameter_names_reach_the_server_intact():
    probe = build()
    async with Toolbox({"probe": probe}) as toolbox:
        tool = next(t for t in toolbox.langchain_tools() if t.name == "reserved")
        message = await tool.ainvoke(call("reserved", RESERVED))
    assert isinstance(message, ToolMessage) and message.status == "success"
    assert probe.calls == [{"tool": "reserved", "arguments": RESERVED}]
    assert message.artifact.structured_content == RESERVED


async def test_tool_errors_become_error_tool_messages_with_the_full_result():
    async with Toolbox({"probe": build()}) as toolbox:
        tools = {t.name: t for t in toolbox.langchain_tools()}
        refused = await tools["refuse"].ainvoke(call("refuse", {"reason": "limit"}))
        invalid = await tools["echo"].ainvoke(call("echo", {"count": 2}))
    assert refused.status == "error" and refused.artifact.structured_content == {"code": "POLICY", "reason": "limit"}
    assert invalid.status == "error" and invalid.artifact.error_kind == "invalid_arguments"
    assert "field 'text'" in invalid.content


def test_sync_invoke_works_from_any_thread():
    with blocking_toolbox({"probe": build()}) as toolbox:
        echo = next(t for t in toolbox.langchain_tools() if t.name == "echo")
        assert '"hi"' in echo.invoke({"text": "hi"})
        out = []
        worker = threading.Thread(target=lambda: out.append(echo.invoke(call("echo", {"text": "t"}))))
        worker.start()
        worker.join(10)
    assert out[0].status == "success"


async def test_the_schema_a_chat_model_binds_is_the_servers_own():
    async with Toolbox({"bank": bank.build_server()}) as toolbox:
        tools = {t.name: t for t in toolbox.langchain_tools()}
        spec = toolbox.catalog["place_order"]
    assert tools["place_order"].args_schema == spec.input_schema
    # LangChain's converter only drops `title` keys; constraints and enums reach the model intact
    params = convert_to_openai_tool(tools["place_order"])["function"]["parameters"]
    assert params["required"] == spec.input_schema["required"]
    assert params["properties"]["side"]["enum"] == ["buy", "sell"]
    assert params["properties"]["quantity"] == {"type": "integer", "minimum": 1}
    assert tools["place_order"].metadata["annotations"]["destructive"] is True


async def test_langgraph_tool_node_runs_mcp_tools_in_a_real_graph():
    probe = build()
    async with Toolbox({"probe": probe}) as toolbox:
        graph = StateGraph(MessagesState)
        graph.add_node("tools", ToolNode(toolbox.langchain_tools()))
        graph.add_edge(START, "tools")
        graph.add_edge("tools", END)
        ai = AIMessage(content="", tool_calls=[call("echo", {"text": "g"}, "c1"), call("reserved", RESERVED, "c2"),
                                               call("refuse", {"reason": "no"}, "c3")])
        out = await graph.compile().ainvoke({"messages": [ai]})
    replies = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert replies["c1"].status == "success" and '"g"' in replies["c1"].content
    assert replies["c2"].artifact.structured_content == RESERVED
    assert replies["c3"].status == "error"
    assert sorted(c["tool"] for c in probe.calls) == ["echo", "refuse", "reserved"]
