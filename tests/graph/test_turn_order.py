"""A tool node given several destructive calls in one AI turn asks about them one at a time, in the order
the model wrote them, each request saying which call of how many it is: whichever call's rehearsal is
done first. Real in-process MCP server (the bundled bank), the scripted fake policy."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from envace_mcp.envs import Episode
from envace_mcp.graph.tool_node import RehearsingToolNode
from envace_mcp.graph.turn_order import Turn
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox

pytestmark = pytest.mark.anyio


class ToolCallingFake(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFake:
        return self


class FirstRehearsalSlower(ScriptedPolicy):
    """The first call's rehearsal is done only after the second's started (a longer prediction, on a real
    model): what made the second call's approval come first."""

    def __init__(self, *rehearse: str) -> None:
        super().__init__(rehearse=rehearse)
        self.second_started = threading.Event()  # threads too: a sync tool node rehearses each call on a loop of its own

    async def rehearse(self, request, sampling=None):
        out = await super().rehearse(request, sampling)
        if request.call.id == "first":
            assert await asyncio.to_thread(self.second_started.wait, 10), "the second call was never rehearsed"
        else:
            self.second_started.set()
        return out


class Person:
    """Answers approval requests one at a time, as a person does, and notes any asked while one is open."""

    def __init__(self) -> None:
        self.shown: list[dict[str, Any]] = []
        self.open = 0
        self.most_open = 0
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> Any:
        with self.lock:
            self.open += 1
            self.most_open = max(self.most_open, self.open)
            self.shown.append(request)
        try:
            return {"type": "approve"}
        finally:
            with self.lock:
                self.open -= 1


def receipt(transfer: dict[str, Any]) -> str:
    body = {"transfer_id": "T-1", **transfer, "from_balance": 0, "to_balance": 0}
    return f"<execution_result>{json.dumps(body)}</execution_result>"


@pytest.mark.parametrize("invoke", ["ainvoke", "invoke"])
async def test_two_destructive_calls_of_one_turn_are_asked_about_in_their_order_one_at_a_time(bank, invoke):
    suite, task = bank
    me = task.initial_state["customer_id"]
    mine = {a["type"]: a["id"] for a in task.initial_state["accounts"].values() if a["owner"] == me}
    first = {"from_account_id": mine["checking"], "to_account_id": mine["savings"], "amount": 1.0}
    second = {**first, "amount": 2.0}
    turn = AIMessage(content="", tool_calls=[{"name": "transfer", "args": first, "id": "first"},
                                             {"name": "transfer", "args": second, "id": "second"}])
    model = ToolCallingFake(messages=iter([turn, AIMessage(content="Done.")]))
    policy = FirstRehearsalSlower(receipt(first), receipt(second))
    person = Person()
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        builder = StateGraph(MessagesState)
        builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        builder.add_node("tools", RehearsingToolNode(toolbox.scoped(episode.meta), policy, approve=person))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        graph, start = builder.compile(), {"messages": [HumanMessage(content="Move $1, then $2, to savings.")]}
        if invoke == "ainvoke":
            out = await asyncio.wait_for(graph.ainvoke(start), 30)
        else:  # a sync graph runs each call in a thread; the toolbox's loop stays free to serve them
            out = await asyncio.wait_for(asyncio.to_thread(graph.invoke, start), 30)
        final = await episode.final_state(toolbox)
    assert [r["tool_call_id"] for r in person.shown] == ["first", "second"]
    assert person.most_open == 1
    assert [(r["call_number"], r["calls_in_turn"]) for r in person.shown] == [(1, 2), (2, 2)]
    assert person.shown[0]["description"].startswith("Call 1 of 2 proposed together")
    assert '"amount": 1.0' in person.shown[0]["description"] and '"amount": 2.0' in person.shown[1]["description"]
    replies = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert replies["first"].status == replies["second"].status == "success"
    savings = task.initial_state["accounts"][mine["savings"]]["balance"]
    assert final["accounts"][mine["savings"]]["balance"] == pytest.approx(savings + 3.0)


async def test_a_call_waits_only_for_the_calls_before_it_to_pass():
    turn = Turn(["a", "b", "c"])
    assert turn.position("c") == (2, 3) and turn.position("z") is None
    order: list[str] = []

    async def call(index: int, name: str) -> None:
        await turn.wait(index)
        order.append(name)
        turn.passed(index)

    third, second = asyncio.create_task(call(2, "c")), asyncio.create_task(call(1, "b"))
    await asyncio.sleep(0)
    assert order == []  # neither may ask before the first has passed
    turn.passed(0)
    await asyncio.wait_for(asyncio.gather(third, second), 5)
    assert order == ["b", "c"]


def test_repeated_ids_place_no_call_in_the_turn():
    assert Turn(["call_1", "call_1"]).position("call_1") is None
