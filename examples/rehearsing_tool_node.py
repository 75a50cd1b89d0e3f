"""Drop-in for a hand-built LangGraph agent: swap `ToolNode` for `RehearsingToolNode`.

The agent here is any LangChain chat model; the embedded model plays the rehearse role. A destructive
call waits for `approve` (a callable shown the call, whole, and its rehearsed outcome): here a rule, in
your agent a person. The gate blocks a call whose rehearsal predicts a failure before anyone is asked;
an unusable rehearsal predicts nothing, so the reviewer decides.

    python examples/rehearsing_tool_node.py
"""

import sys

import anyio
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from envace_mcp import Toolbox
from envace_mcp.envs import Episode, get_suite
from envace_mcp.graph.tool_node import RehearsingToolNode
from envace_mcp.policy import SamplingParams, load_policy


def review(request: dict) -> bool:
    """Your reviewer: here a rule that lets no transfer over $100 through."""
    print("approval requested:\n" + request["description"])  # the call's every argument, control characters shown
    return request["args"].get("amount", 0) <= 100


async def main() -> None:
    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "savings_minimum")
    policy = load_policy(role_sampling={"rehearse": SamplingParams(max_new_tokens=48, temperature=0)})
    # Your agent's model goes here; a scripted one keeps the example deterministic.
    proposals = iter([AIMessage(content="", tool_calls=[{"name": "transfer", "args": task.trap.arguments, "id": "c1"}]),
                      AIMessage(content="Done.")])

    async def agent(state: MessagesState):
        return {"messages": [next(proposals)]}

    async with Toolbox({"mcpServers": {"bank": suite.stdio_config(sys.executable)}}) as toolbox:
        episode = Episode(task, "bank")
        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent)
        builder.add_node("tools", RehearsingToolNode(toolbox.scoped(episode.meta), policy, approve=review))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        out = await builder.compile().ainvoke({"messages": [HumanMessage(content=task.instruction)]})
    for message in out["messages"]:
        record = message.additional_kwargs.get("envace_rehearsal")
        if record:
            print(f"{record['tool']}: rehearsal={record['prediction'] and record['prediction']['status']} "
                  f"decision={record['decision']} real={'yes' if record.get('real') else 'no'}")


if __name__ == "__main__":
    anyio.run(main)
