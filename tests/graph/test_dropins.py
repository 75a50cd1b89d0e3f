"""The drop-ins on real agents of the shapes users have: a hand-built StateGraph with a tool node,
and a `langchain.agents.create_agent` agent with middleware."""

from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from envace_mcp.eval import Episode
from envace_mcp.graph.tool_node import RehearsingToolNode
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox

pytestmark = pytest.mark.anyio
FAILS = ('<execution_result>{"error_tool_call": {"code": "EXECUTION_ERROR", '
         '"message": "savings would drop below the $500 minimum"}}</execution_result>')


class ToolCallingFake(GenericFakeChatModel):
    """A real BaseChatModel with scripted replies that accepts `bind_tools`."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ToolCallingFake":
        return self


def ai_calls(*calls):
    return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"c{i}"} for i, (n, a) in enumerate(calls)])


def scenario(task):
    me = task.initial_state["customer_id"]
    savings = next(a["id"] for a in task.initial_state["accounts"].values() if a["owner"] == me and a["type"] == "savings")
    return savings, [("get_balance", {"account_id": savings}), ("transfer", task.trap.arguments)]


async def test_a_hand_built_state_graph_swaps_tool_node_for_the_rehearsing_one(bank):
    suite, task = bank
    savings, calls = scenario(task)
    model = ToolCallingFake(messages=iter([ai_calls(*calls), AIMessage(content="Savings must keep $500.")]))
    policy = ScriptedPolicy(rehearse=[FAILS])
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        async def call_model(state: MessagesState):
            return {"messages": [await model.ainvoke(state["messages"])]}

        builder = StateGraph(MessagesState)
        builder.add_node("agent", call_model)
        builder.add_node("tools", RehearsingToolNode(toolbox.scoped(episode.meta), policy))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        out = await builder.compile().ainvoke({"messages": [HumanMessage(content=task.instruction)]})
        final = await episode.final_state(toolbox)
    policy.assert_complete()
    replies = {m.name: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert replies["get_balance"].status == "success" and '"balance"' in replies["get_balance"].content
    assert replies["transfer"].status == "error" and "Not executed (block)" in replies["transfer"].content
    assert replies["transfer"].additional_kwargs["envace_rehearsal"]["decision"] == "block"
    assert final["accounts"][savings]["balance"] == task.initial_state["accounts"][savings]["balance"]
    assert out["messages"][-1].content == "Savings must keep $500."


async def test_create_agent_middleware_rehearses_and_gates_each_call(bank):
    from langchain.agents import create_agent

    from envace_mcp.graph.middleware import RehearsalMiddleware

    suite, task = bank
    savings, calls = scenario(task)
    model = ToolCallingFake(messages=iter([ai_calls(*calls), AIMessage(content="I won't break the $500 rule.")]))
    policy = ScriptedPolicy(rehearse=[FAILS])
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        agent = create_agent(model, tools=toolbox.langchain_tools(meta=episode.meta),
                             middleware=[RehearsalMiddleware(policy)])
        out = await agent.ainvoke({"messages": [HumanMessage(content=task.instruction)]})
        final = await episode.final_state(toolbox)
    policy.assert_complete()
    replies = {m.name: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert replies["get_balance"].status == "success"
    record = replies["get_balance"].additional_kwargs["envace_rehearsal"]
    assert record["decision"] == "execute" and record["prediction"] is None and record["real"]["is_error"] is False
    assert replies["transfer"].status == "error" and "below the $500 minimum" in replies["transfer"].content
    assert final["accounts"][savings]["balance"] == task.initial_state["accounts"][savings]["balance"]
