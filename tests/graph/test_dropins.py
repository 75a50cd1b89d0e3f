"""The drop-ins on real agents of the shapes users have: a hand-built StateGraph with a tool node,
and a `langchain.agents.create_agent` agent with middleware."""

from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from envace_mcp.envs import Episode
from envace_mcp.graph import GateConfig
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
        builder.add_node("tools", RehearsingToolNode(toolbox.scoped(episode.meta), policy,
                                                     gate=GateConfig(require_approval="never")))
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


def ok(transfer):
    """A rehearsal predicting the transfer succeeds (all of its output schema's fields)."""
    import json

    body = {"transfer_id": "T-1", **transfer, "from_balance": 0, "to_balance": 0}
    return f"<execution_result>{json.dumps(body)}</execution_result>"


def small_transfer(task, amount=1.0):
    me = task.initial_state["customer_id"]
    mine = {a["type"]: a["id"] for a in task.initial_state["accounts"].values() if a["owner"] == me}
    return mine, {"from_account_id": mine["checking"], "to_account_id": mine["savings"], "amount": amount}


async def test_the_rehearsing_tool_node_is_a_tool_node_with_its_options_and_tool_runtime_injection(bank):
    from langchain_core.tools import tool
    from langchain.tools import ToolRuntime
    from langgraph.prebuilt import ToolNode
    from typing_extensions import Annotated, TypedDict
    from langgraph.graph.message import add_messages

    from envace_mcp.graph.state import upsert_records

    suite, task = bank
    savings, calls = scenario(task)
    seen = {}

    @tool
    def whoami(runtime: ToolRuntime) -> str:
        """Who the agent works for (reads the graph state through the injected tool runtime)."""
        seen["state_keys"] = sorted(runtime.state)
        return "customer " + task.initial_state["customer_id"]

    @tool
    def flaky(x: int) -> str:
        """Always fails."""
        raise ValueError("flaky is down")

    for read in (whoami, flaky):  # MCP's defaults would take a tool without annotations for a destructive one
        read.metadata = {"annotations": {"read_only": True}}

    class State(TypedDict):
        chat: Annotated[list, add_messages]
        rehearsals: Annotated[list, upsert_records]

    model = ToolCallingFake(messages=iter([ai_calls(("whoami", {}), ("flaky", {"x": 1}), *calls),
                                           AIMessage(content="done")]))
    policy = ScriptedPolicy(rehearse=[FAILS])
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        node = RehearsingToolNode([*toolbox.langchain_tools(meta=episode.meta), whoami, flaky], policy,
                                  gate=GateConfig(require_approval="never"), record_key="rehearsals", messages_key="chat",
                                  handle_tool_errors=True)
        assert isinstance(node, ToolNode)

        async def call_model(state: State):
            return {"chat": [await model.ainvoke(state["chat"])]}

        builder = StateGraph(State)
        builder.add_node("agent", call_model)
        builder.add_node("tools", node)
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", lambda s: "tools" if s["chat"][-1].tool_calls else "__end__")
        builder.add_edge("tools", "agent")
        out = await builder.compile().ainvoke({"chat": [HumanMessage(content=task.instruction)], "rehearsals": []})
    policy.assert_complete()
    replies = {m.name: m for m in out["chat"] if isinstance(m, ToolMessage)}
    assert replies["whoami"].content.startswith("customer ") and "chat" in seen["state_keys"]
    assert replies["flaky"].status == "error" and "flaky is down" in replies["flaky"].content  # handle_tool_errors
    assert "Not executed (block)" in replies["transfer"].content
    decisions = {r["tool"]: r["decision"] for r in out["rehearsals"]}
    assert decisions == {"whoami": "execute", "flaky": "execute", "get_balance": "execute", "transfer": "block"}
    assert next(r for r in out["rehearsals"] if r["tool"] == "get_balance")["real"]["is_error"] is False


def test_a_rehearsing_tool_node_refuses_approvals_it_cannot_pause_for_safely():
    from envace_mcp.errors import UserError
    from envace_mcp.graph import GateConfig

    with pytest.raises(UserError, match="approve="):
        RehearsingToolNode([], ScriptedPolicy(), gate=GateConfig(require_approval="destructive"))
    RehearsingToolNode([], ScriptedPolicy(), gate=GateConfig(require_approval="destructive"), approve=lambda r: True)


async def hitl_agent(toolbox, episode, policy, replies, checkpointer):
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    from envace_mcp.graph.middleware import RehearsalMiddleware

    tools = toolbox.langchain_tools(meta=episode.meta)
    rehearsal = RehearsalMiddleware(policy, tools=tools, gate=GateConfig(require_approval="never"))  # review asks
    review = HumanInTheLoopMiddleware(interrupt_on={"transfer": {"allowed_decisions": ["approve", "edit", "reject"],
                                                                 "description": rehearsal.describe}})
    model = ToolCallingFake(messages=iter(replies))
    return create_agent(model, tools=tools, middleware=[review, rehearsal], checkpointer=checkpointer)


@pytest.mark.parametrize("answer", ["approve", "edit", "reject"])
async def test_create_agent_with_human_in_the_loop_shows_the_rehearsed_outcome_and_takes_each_decision(bank, answer):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    suite, task = bank
    mine, transfer = small_transfer(task)
    policy = ScriptedPolicy(rehearse=[ok(transfer)] + ([ok({**transfer, "amount": 2.0})] if answer == "edit" else []))  # an edited call is rehearsed again
    episode = Episode(task, "bank")
    start = task.initial_state["accounts"][mine["checking"]]["balance"]
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        agent = await hitl_agent(toolbox, episode, policy, [ai_calls(("transfer", transfer)), AIMessage(content="ok")],
                                 InMemorySaver())
        config = {"configurable": {"thread_id": answer}}
        paused = await agent.ainvoke({"messages": [HumanMessage(content=task.instruction)]}, config)
        (request,) = paused["__interrupt__"][0].value["action_requests"]
        assert "Rehearsed outcome: succeeds" in request["description"] and '"T-1"' in request["description"]
        decision = {"approve": {"type": "approve"}, "reject": {"type": "reject", "message": "not today"},
                    "edit": {"type": "edit", "edited_action": {"name": "transfer", "args": {**transfer, "amount": 2.0}}}}[answer]
        out = await agent.ainvoke(Command(resume={"decisions": [decision]}), config)
        final = await episode.final_state(toolbox)
    policy.assert_complete()
    moved = round(start - final["accounts"][mine["checking"]]["balance"], 2)
    assert moved == {"approve": 1.0, "edit": 2.0, "reject": 0.0}[answer]
    records = {r["call_id"]: r for r in out.get("rehearsals", [])}
    assert records["c0"]["prediction"]["status"] == "result"
    if answer != "reject":
        assert records["c0"]["real"]["is_error"] is False and records["c0"]["arguments"]["amount"] == moved


async def test_the_gates_own_approvals_pause_per_call_in_create_agent_and_resuming_runs_nothing_twice(bank):
    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    from envace_mcp.graph import GateConfig
    from envace_mcp.graph.middleware import RehearsalMiddleware
    from probe_server import build as build_probe

    suite, task = bank
    mine, transfer = small_transfer(task)
    probe = build_probe()
    policy = ScriptedPolicy(rehearse=[ok(transfer)])
    episode = Episode(task, "bank")
    start = task.initial_state["accounts"][mine["checking"]]["balance"]
    async with Toolbox({"bank": suite.build_server(), "probe": probe}) as toolbox:
        tools = toolbox.langchain_tools(meta=episode.meta)
        model = ToolCallingFake(messages=iter([ai_calls(("echo", {"text": "hi"}), ("transfer", transfer)),
                                               AIMessage(content="ok")]))
        agent = create_agent(model, tools=tools, checkpointer=InMemorySaver(),
                             middleware=[RehearsalMiddleware(policy, tools=tools, gate=GateConfig(require_approval="destructive"))])
        config = {"configurable": {"thread_id": "t"}}
        paused = await agent.ainvoke({"messages": [HumanMessage(content=task.instruction)]}, config)
        (pause,) = paused["__interrupt__"]
        assert pause.value["type"] == "tool_approval" and pause.value["name"] == "transfer"
        assert pause.value["rehearsal"]["status"] == "result" and "Rehearsed outcome: succeeds" in pause.value["description"]
        out = await agent.ainvoke(Command(resume={"type": "approve"}), config)
        final = await episode.final_state(toolbox)
    policy.assert_complete()  # one rehearsal: resuming did not rehearse again
    assert len(probe.calls) == 1  # the read ran once
    assert round(start - final["accounts"][mine["checking"]]["balance"], 2) == 1.0
    record = next(r for r in out["rehearsals"] if r["tool"] == "transfer")
    assert record["decision"] == "ask" and record["approved"] is True and record["real"]["is_error"] is False


def test_sync_create_agent_with_limit_and_retry_middleware_in_the_documented_order(bank):
    from langchain.agents import create_agent
    from langchain.agents.middleware import ToolCallLimitMiddleware, ToolRetryMiddleware
    from langchain_core.tools import tool

    from envace_mcp.graph.middleware import RehearsalMiddleware
    from envace_mcp.toolbox import blocking_toolbox

    suite, task = bank
    savings, calls = scenario(task)
    attempts = []

    @tool
    def lookup(q: str) -> str:
        """A read that fails once, then works."""
        attempts.append(q)
        if len(attempts) == 1:
            raise ConnectionError("try again")
        return "found " + q

    lookup.metadata = {"annotations": {"read_only": True}}
    episode = Episode(task, "bank")
    policy = ScriptedPolicy(rehearse=[FAILS])  # the transfer only: lookup is read-only, the limited call never rehearsed
    with blocking_toolbox({"bank": suite.build_server()}) as toolbox:
        tools = [*toolbox.langchain_tools(meta=episode.meta), lookup]
        model = ToolCallingFake(messages=iter([ai_calls(("lookup", {"q": "x"}), calls[1], ("lookup", {"q": "y"})),
                                               AIMessage(content="done")]))
        agent = create_agent(model, tools=tools, middleware=[
            RehearsalMiddleware(policy, tools=tools),
            ToolCallLimitMiddleware(tool_name="lookup", run_limit=1),
            ToolRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False, retry_on=(ConnectionError,))])
        out = agent.invoke({"messages": [HumanMessage(content=task.instruction)]})
    policy.assert_complete()
    replies = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    by_id = {m.tool_call_id: m for m in replies}
    assert by_id["c0"].content == "found x" and attempts == ["x", "x"]  # retried inside, rehearsed never (a read)
    assert "Not executed (block)" in by_id["c1"].content  # rehearsed and gated, in a sync agent
    assert by_id["c2"].status == "error" and attempts == ["x", "x"]  # over the limit: never ran, never rehearsed
    assert {r["tool"] for r in out["rehearsals"] if r.get("prediction")} == {"transfer"}


def test_the_agents_model_sees_rehearsal_memory_as_the_graphs_act_prompt_does(bank):
    import anyio
    from langchain.agents import create_agent

    from envace_mcp.graph.middleware import RehearsalMiddleware
    from envace_mcp.policy.chat_model import PolicyChatModel
    from envace_mcp.policy.prompts import MEMORY_HEADER, tool_call_text
    from envace_mcp.testing import FunctionPolicy

    suite, task = bank
    savings, calls = scenario(task)
    seen = []

    def act(request):
        seen.append(request)
        return tool_call_text(*calls[1]) if len(seen) == 1 else "Savings must keep $500."

    async def go():
        async with Toolbox({"bank": suite.build_server()}) as toolbox:
            tools = toolbox.langchain_tools(meta=Episode(task, "bank").meta)
            agent = create_agent(PolicyChatModel(policy=FunctionPolicy(act=act)), tools=tools,
                                 middleware=[RehearsalMiddleware(ScriptedPolicy(rehearse=[FAILS]), tools=tools)])
            return await agent.ainvoke({"messages": [HumanMessage(content=task.instruction)]})

    out = anyio.run(go)
    assert len(seen) == 2 and seen[0].task == task.instruction
    memory = seen[1].messages[-1]
    assert memory.content.startswith(MEMORY_HEADER) and "transfer" in memory.content and "block" in memory.content
    assert not any(str(m.content).startswith(MEMORY_HEADER) for m in out["messages"])  # never stored in the conversation


async def test_the_middlewares_gate_reads_the_agents_own_conversation_for_its_evidence_rules(bank):
    """In a create_agent agent the evidence rules see the agent's messages: a made-up account and a refused
    transfer sent again are blocked before the server, though every rehearsal said they would succeed."""
    from langchain.agents import create_agent

    from envace_mcp.graph import GateConfig
    from envace_mcp.graph.middleware import RehearsalMiddleware

    suite, task = bank
    mine, _ = small_transfer(task)
    made_up = {"from_account_id": "CHK-0000", "to_account_id": mine["savings"], "amount": 1.0}
    too_much = {"from_account_id": mine["checking"], "to_account_id": mine["savings"], "amount": 10_000_000.0}
    turns = [AIMessage(content="", tool_calls=[{"name": "transfer", "args": args, "id": f"t{i}"}])
             for i, args in enumerate((made_up, too_much, too_much))]
    model = ToolCallingFake(messages=iter([*turns, AIMessage(content="I could not move it.")]))
    policy = ScriptedPolicy(rehearse=[ok(made_up), ok(too_much), ok(too_much)])
    gate = GateConfig(evidence=["ungrounded_arguments", "repeated_failures"], require_approval="never")
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        agent = create_agent(model, tools=toolbox.langchain_tools(meta=episode.meta),
                             middleware=[RehearsalMiddleware(policy, gate=gate)])
        out = await agent.ainvoke({"messages": [HumanMessage(content=task.instruction)]})
        assert await episode.final_state(toolbox) == task.initial_state
    policy.assert_complete()
    records = [m.additional_kwargs["envace_rehearsal"] for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [r["decision"] for r in records] == ["block", "execute", "block"]
    assert "'CHK-0000' appears nowhere" in records[0]["reason"] and "refused this exact call" in records[2]["reason"]
    assert records[1]["real"]["is_error"] is True
