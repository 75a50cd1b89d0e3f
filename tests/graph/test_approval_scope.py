"""Which calls wait for a person by default, alike in every form (the EnvACE graph, `RehearsingToolNode`,
`RehearsalMiddleware`): destructive ones (a tool without hints is destructive, as the MCP spec says), not
every write. A write its server annotates not destructive runs unasked, as a read does. Real in-process
MCP server; scripted models."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations as Hints

from envace_mcp.graph import EnvaceContext, create_envace_graph
from envace_mcp.graph.tool_node import RehearsingToolNode
from envace_mcp.policy.chat_backend import ChatModelPolicy
from envace_mcp.policy.roles import RolePolicies
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox

pytestmark = pytest.mark.anyio


class ToolCallingFake(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFake:
        return self


def notes_server() -> MCPServer:
    """A write that only adds (not destructive), one that deletes, and one its author left without hints."""
    server = MCPServer("notes", log_level="WARNING")
    notes: dict[str, str] = {"1": "keep"}
    server.notes = notes  # type: ignore[attr-defined]

    @server.tool(annotations=Hints(read_only_hint=False, destructive_hint=False))
    def add_note(text: str) -> str:
        """Add a note."""
        notes[str(len(notes) + 1)] = text
        return "added"

    @server.tool(annotations=Hints(destructive_hint=True))
    def delete_note(note_id: str) -> str:
        """Delete a note."""
        return f"deleted {notes.pop(note_id)}"

    @server.tool()
    def clear_notes() -> str:
        """Delete every note."""
        notes.clear()
        return "cleared"

    return server


CALLS = AIMessage(content="", tool_calls=[{"name": "add_note", "args": {"text": "new"}, "id": "add"},
                                          {"name": "delete_note", "args": {"note_id": "1"}, "id": "del"},
                                          {"name": "clear_notes", "args": {}, "id": "clear"}])
PREDICTS_SUCCESS = "<execution_result>\"done\"</execution_result>"


@pytest.mark.parametrize("form", ["graph", "tool node", "middleware"])
async def test_only_destructive_calls_wait_for_a_person_and_a_write_annotated_not_destructive_runs_unasked(form):
    from langchain.agents import create_agent

    from envace_mcp.graph.middleware import RehearsalMiddleware

    server = notes_server()
    model = ToolCallingFake(messages=iter([CALLS, AIMessage(content="Done.")]))
    rehearse = ScriptedPolicy(rehearse=[PREDICTS_SUCCESS] * 3)  # every write is rehearsed, asked or not
    asked: list[str] = []

    def person(request: dict[str, Any]) -> Any:
        asked.append(request["name"])
        return {"type": "reject", "message": "not now"}

    start = {"messages": [HumanMessage(content="Add a note, then clean up.")]}
    async with Toolbox({"notes": server}) as toolbox:
        if form == "graph":
            out = await create_envace_graph().compile().ainvoke(start, context=EnvaceContext(
                policy=RolePolicies(ChatModelPolicy(model), rehearse), toolbox=toolbox, approve=person))
        elif form == "tool node":
            builder = StateGraph(MessagesState)
            builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
            builder.add_node("tools", RehearsingToolNode(toolbox, rehearse, approve=person))
            builder.add_edge(START, "agent")
            builder.add_conditional_edges("agent", tools_condition)
            builder.add_edge("tools", "agent")
            out = await builder.compile().ainvoke(start)
        else:
            tools = toolbox.langchain_tools()
            out = await create_agent(model, tools=tools, middleware=[
                RehearsalMiddleware(rehearse, tools=tools, approve=person)]).ainvoke(start)
    rehearse.assert_complete()
    assert sorted(asked) == ["clear_notes", "delete_note"], form
    assert server.notes == {"1": "keep", "2": "new"}, form  # the add ran unasked; nothing was deleted
    replies = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert replies["add"].status == "success", form
    assert all("not approved" in replies[i].content for i in ("del", "clear")), form
