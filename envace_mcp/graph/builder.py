"""`create_envace_graph()`: agent → rehearse → gate → act (one task per call) → agent."""

from __future__ import annotations

from typing import Literal

from langgraph.graph import END, START, StateGraph

from envace_mcp.graph.nodes._common import last_ai
from envace_mcp.graph.nodes.act import act
from envace_mcp.graph.nodes.agent import agent
from envace_mcp.graph.nodes.gate import gate_node, route_calls_async
from envace_mcp.graph.nodes.rehearse import rehearse
from envace_mcp.graph.state import EnvaceContext, EnvaceState


async def route_after_agent(state: EnvaceState) -> Literal["rehearse", "agent", "__end__"]:
    """Calls go to rehearsal; a format reminder goes back to the agent; anything else ends the run."""
    if state.get("status") in ("finished", "max_steps", "stalled"):
        return END
    message = last_ai(state["messages"])
    if message is not None and message.tool_calls:
        return "rehearse"
    return "agent"


def create_envace_graph() -> StateGraph:
    """The EnvACE graph, uncompiled: compile it with your own checkpointer.

        graph = create_envace_graph().compile(checkpointer=InMemorySaver())
        await graph.ainvoke({"messages": [("user", task)]}, context=EnvaceContext(policy=..., toolbox=...))
    """
    graph = StateGraph(EnvaceState, context_schema=EnvaceContext)
    graph.add_node("agent", agent)
    graph.add_node("rehearse", rehearse)
    graph.add_node("gate", gate_node)
    graph.add_node("act", act)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route_after_agent, {"rehearse": "rehearse", "agent": "agent", END: END})
    graph.add_edge("rehearse", "gate")
    graph.add_conditional_edges("gate", route_calls_async, ["act"])
    graph.add_edge("act", "agent")
    return graph
