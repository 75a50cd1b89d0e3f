"""Drop-in for a hand-built LangGraph agent: swap `ToolNode` for `RehearsingToolNode`.

The agent here is any LangChain chat model; the embedded model plays the rehearse role. Untrained,
SmolLM2's rehearsals are usually unusable (`invalid`), and an unusable rehearsal does not stop a call:
the gate then lets the proposed transfer through. A trained rehearse role (see `envace train`)
predicts the policy failure and the gate blocks it.

    python examples/rehearsing_tool_node.py
"""

import sys

import anyio
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from envace_mcp import Toolbox
from envace_mcp.eval import Episode, get_suite
from envace_mcp.graph.tool_node import RehearsingToolNode
from envace_mcp.policy import SamplingParams, load_policy


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
        builder.add_node("tools", RehearsingToolNode(toolbox.scoped(episode.meta), policy))
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
