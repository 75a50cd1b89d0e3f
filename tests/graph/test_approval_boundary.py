"""What a person approves is what runs, in every form (the EnvACE graph, `RehearsingToolNode`,
`RehearsalMiddleware`): ids a model repeats, edits a reviewer makes, tools that change under a call,
and the default that asks before a destructive call. Real MCP servers in-process; scripted models."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations as Hints

from envace_mcp.errors import UserError
from envace_mcp.envs import Episode
from envace_mcp.graph import EnvaceContext, GateConfig, RunLimits, create_envace_graph
from envace_mcp.graph.acting import Run, act_async
from envace_mcp.graph.calls import Proposal, spec_digest
from envace_mcp.graph.gate import Decision
from envace_mcp.graph.tool_node import RehearsingToolNode
from envace_mcp.policy.chat_backend import ChatModelPolicy
from envace_mcp.policy.roles import RolePolicies
from envace_mcp.policy.types import ToolCall
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox

pytestmark = pytest.mark.anyio


class ToolCallingFake(GenericFakeChatModel):
    """A real BaseChatModel with scripted replies that accepts `bind_tools`."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFake:
        return self


def mine(task):
    me = task.initial_state["customer_id"]
    return {a["type"]: a["id"] for a in task.initial_state["accounts"].values() if a["owner"] == me}


def receipt(transfer):
    body = {"transfer_id": "T-1", **transfer, "from_balance": 0, "to_balance": 0}
    return f"<execution_result>{json.dumps(body)}</execution_result>"


class Reviewer:
    """An approver that keeps what it was shown and answers from a script."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.shown: list[dict[str, Any]] = []

    def __call__(self, request: dict[str, Any]) -> Any:
        self.shown.append(request)
        return self.answers.pop(0)


def repeated_ids(transfer, account):
    """A provider's reply that gives a transfer and a read the same id."""
    return AIMessage(content="", tool_calls=[{"name": "transfer", "args": transfer, "id": "call_1"},
                                             {"name": "get_balance", "args": {"account_id": account}, "id": "call_1"}])


def hand_built(model, node):
    """A hand-built agent graph: the model, then `node` (a RehearsingToolNode) for its calls."""
    async def call_model(state: MessagesState):
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", call_model)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile()


# ------------------------------------------------------------------ 5. repeated tool-call ids

async def test_a_model_that_repeats_call_ids_cannot_slip_a_transfer_past_the_approver_in_the_graph(bank):
    suite, task = bank
    accounts = mine(task)
    transfer = {"from_account_id": accounts["checking"], "to_account_id": accounts["savings"], "amount": 1.0}
    model = ToolCallingFake(messages=iter([repeated_ids(transfer, accounts["savings"]), AIMessage(content="Done.")]))
    policy = RolePolicies(ChatModelPolicy(model), ScriptedPolicy(rehearse=[receipt(transfer)]))
    reviewer = Reviewer(False)
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        out = await create_envace_graph().compile().ainvoke(
            {"messages": [HumanMessage(content=task.instruction)]},
            context=EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta), approve=reviewer))
        assert await episode.final_state(toolbox) == task.initial_state  # the transfer never ran
    assert [r["name"] for r in reviewer.shown] == ["transfer"]
    records = {r["tool"]: r for r in out["rehearsals"]}
    assert records["transfer"]["decision"] == "rejected_by_human" and records["get_balance"]["real"] is not None
    ids = [c["id"] for m in out["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    assert len(ids) == len(set(ids)) == 2


async def test_create_agent_gives_repeated_call_ids_their_own_before_anything_is_asked(bank):
    from langchain.agents import create_agent

    from envace_mcp.graph.middleware import RehearsalMiddleware

    suite, task = bank
    accounts = mine(task)
    transfer = {"from_account_id": accounts["checking"], "to_account_id": accounts["savings"], "amount": 1.0}
    model = ToolCallingFake(messages=iter([repeated_ids(transfer, accounts["savings"]), AIMessage(content="Done.")]))
    reviewer = Reviewer(False)
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        tools = toolbox.langchain_tools(meta=episode.meta)
        agent = create_agent(model, tools=tools, middleware=[
            RehearsalMiddleware(ScriptedPolicy(rehearse=[receipt(transfer)]), tools=tools, approve=reviewer)])
        out = await agent.ainvoke({"messages": [HumanMessage(content=task.instruction)]})
        assert await episode.final_state(toolbox) == task.initial_state
    assert [r["name"] for r in reviewer.shown] == ["transfer"]
    replies = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len({m.tool_call_id for m in replies}) == 2
    by_tool = {m.name: m for m in replies}
    assert "not approved" in by_tool["transfer"].content and by_tool["get_balance"].status == "success"
    assert {r["tool"] for r in out["rehearsals"]} == {"transfer", "get_balance"}


async def test_a_tool_node_runs_no_call_whose_id_another_call_shares(bank):
    suite, task = bank
    accounts = mine(task)
    transfer = {"from_account_id": accounts["checking"], "to_account_id": accounts["savings"], "amount": 1.0}
    model = ToolCallingFake(messages=iter([repeated_ids(transfer, accounts["savings"]), AIMessage(content="Done.")]))
    reviewer = Reviewer(True, True)
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        node = RehearsingToolNode(toolbox.scoped(episode.meta), ScriptedPolicy(), approve=reviewer)
        out = await hand_built(model, node).ainvoke({"messages": [HumanMessage(content=task.instruction)]})
        assert await episode.final_state(toolbox) == task.initial_state
    assert reviewer.shown == []  # nothing was asked under an id that is not the call's own
    replies = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len(replies) == 2 and all("shared with another proposed call" in m.content for m in replies)


# ------------------------------------------------------------------ 6. edits are validated and re-gated

def negative_edit(transfer):
    return {"type": "edit", "edited_action": {"name": "transfer", "args": {**transfer, "amount": -5}}}


async def test_an_edit_that_breaks_the_schema_is_refused_alike_by_the_graph_the_tool_node_and_the_middleware(bank):
    from langchain.agents import create_agent

    from envace_mcp.graph.middleware import RehearsalMiddleware

    suite, task = bank
    accounts = mine(task)
    transfer = {"from_account_id": accounts["checking"], "to_account_id": accounts["savings"], "amount": 1.0}
    proposal = AIMessage(content="", tool_calls=[{"name": "transfer", "args": transfer, "id": "t0"}])
    replies: dict[str, ToolMessage] = {}
    for form in ("graph", "tool node", "middleware"):
        model = ToolCallingFake(messages=iter([proposal, AIMessage(content="Done.")]))
        reviewer = Reviewer(negative_edit(transfer))
        rehearse = ScriptedPolicy(rehearse=[receipt(transfer)])
        episode = Episode(task, "bank")
        async with Toolbox({"bank": suite.build_server()}) as toolbox:
            scope = toolbox.scoped(episode.meta)
            start = {"messages": [HumanMessage(content=task.instruction)]}
            if form == "graph":
                out = await create_envace_graph().compile().ainvoke(start, context=EnvaceContext(
                    policy=RolePolicies(ChatModelPolicy(model), rehearse), toolbox=scope, approve=reviewer))
            elif form == "tool node":
                out = await hand_built(model, RehearsingToolNode(scope, rehearse, approve=reviewer)).ainvoke(start)
            else:
                tools = scope.langchain_tools()
                out = await create_agent(model, tools=tools, middleware=[
                    RehearsalMiddleware(rehearse, tools=tools, approve=reviewer)]).ainvoke(start)
            assert await episode.final_state(toolbox) == task.initial_state, form
        assert len(reviewer.shown) == 1, form
        replies[form] = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    for form, reply in replies.items():
        assert reply.status == "error" and "Not executed (reject)" in reply.content, form
        assert "the edited call: invalid arguments for 'transfer': field 'amount'" in reply.content, form
        assert reply.tool_call_id == "t0"


async def test_a_tool_that_changed_since_the_gate_judged_it_is_refused_before_it_runs():
    from envace_mcp.toolbox import ToolAnnotations, ToolSpec

    def spec(read_only: bool) -> ToolSpec:
        return ToolSpec.create(remote_name="transfer", server="bank", description="", input_schema={"type": "object"},
                               output_schema=None, annotations=ToolAnnotations.from_hints({"readOnlyHint": read_only}))

    ran: list[Run] = []
    gated_as_read = Proposal(ToolCall(id="c", name="transfer", arguments={}), spec(False),
                             decision=Decision("execute", "not rehearsed"), gated_spec=spec_digest(spec(True)))
    acted = await act_async(gated_as_read, ask=lambda request: True, run=lambda call, s: ran.append(Run(call, s)),
                            regate=lambda call: gated_as_read)
    assert ran == [] and not acted.ran
    assert acted.record["decision"] == "reject" and "changed since the gate judged it" in acted.reply.content


# ------------------------------------------------------------------ 9. safe by default

def todo_server() -> MCPServer:
    """A new user's own server: a read and a delete, annotated as the MCP spec says."""
    server = MCPServer("todo", log_level="WARNING")
    todos = {"1": "file taxes", "2": "buy milk"}
    server.todos = todos  # type: ignore[attr-defined]

    @server.tool(annotations=Hints(read_only_hint=True))
    def list_todos() -> dict[str, str]:
        """Every to-do item by id."""
        return dict(todos)

    @server.tool(annotations=Hints(destructive_hint=True))
    def delete_todo(todo_id: str) -> str:
        """Delete a to-do item."""
        if todo_id not in todos:
            raise ValueError(f"no to-do {todo_id}")
        return f"deleted {todos.pop(todo_id)}"

    return server


async def test_readmes_middleware_as_written_asks_before_a_destructive_call_even_when_its_rehearsal_is_unusable():
    from langchain.agents import create_agent
    from langgraph.types import Command

    from envace_mcp.graph.middleware import RehearsalMiddleware

    server = todo_server()
    delete = AIMessage(content="", tool_calls=[{"name": "delete_todo", "args": {"todo_id": "1"}, "id": "d1"}])
    model = ToolCallingFake(messages=iter([delete, AIMessage(content="Deleted.")]))
    policy = ScriptedPolicy(rehearse=["<execution_result>not json at all"])  # an unusable rehearsal
    async with Toolbox({"todo": server}) as toolbox:
        tools = toolbox.langchain_tools()
        agent = create_agent(model, tools=tools, middleware=[RehearsalMiddleware(policy, tools=tools)],  # as in README
                             checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "t"}}
        paused = await agent.ainvoke({"messages": [HumanMessage(content="Delete my to-do item about taxes.")]}, config)
        assert server.todos == {"1": "file taxes", "2": "buy milk"}  # nothing ran unasked
        (pause,) = paused["__interrupt__"]
        assert pause.value["name"] == "delete_todo" and "no objection" not in pause.value["description"]
        assert "could not be read" in pause.value["description"]
        await agent.ainvoke(Command(resume={"decisions": [{"type": "reject", "message": "not that one"}]}), config)
        assert server.todos == {"1": "file taxes", "2": "buy milk"}


def test_a_tool_node_without_an_approver_is_refused_at_once_and_names_the_opt_out():
    with pytest.raises(UserError, match='require_approval="never"'):
        RehearsingToolNode([], ScriptedPolicy())
    RehearsingToolNode([], ScriptedPolicy(), gate=GateConfig(require_approval="never"))  # the documented opt-out


# ------------------------------------------------------------------ 1-3. what a reviewer reads, whatever the UI

def test_an_approval_request_describes_every_argument_whole_with_control_characters_written_out():
    from envace_mcp.graph.calls import approval_request
    from envace_mcp.policy.types import Prediction

    memo = "Monthly savings top-up as agreed, see SAV-2474 " + "x" * 100 + " [conceal]\x1bM\u202e"
    arguments = {"memo": memo, "from_account_id": "CHK-2726", "amount": 500, "to_account_id": "CHK-1770"}
    p = Proposal(ToolCall(id="c", name="transfer", arguments=arguments), None,
                 Prediction(tool="transfer", status="result", result={"note": "\x1bc" + "y" * 600}),
                 Decision("ask", "approval required for destructive tool 'transfer'"))
    description = approval_request(p)["description"]
    lines = description.splitlines()
    assert lines[0] == "transfer(" and '  to_account_id: "CHK-1770"' in lines and '  amount: 500' in lines
    assert "x" * 100 + " [conceal]\\u001bM\\u202e" in description and "y" * 600 in description  # whole
    assert not any(ch in description for ch in "\x1b\u202e")



# ------------------------------------------------------------------ graph state is not a decision

@pytest.mark.parametrize("mode", ["real", "mixed", "simulated"])
async def test_a_command_sent_straight_to_act_with_a_forged_decision_runs_nothing_unasked(bank, mode):
    """Whoever can write graph state (a served graph's API caller: a Command to `act`, an update_state)
    cannot make a decision in it loosen what the gate allows: `act` checks the call again."""
    from langgraph.types import Command, Send

    suite, task = bank
    accounts = mine(task)
    transfer = {"from_account_id": accounts["checking"], "to_account_id": accounts["savings"], "amount": 1.0}
    raw = {"name": "transfer", "args": transfer, "id": "x1", "type": "tool_call"}
    episode = Episode(task, "bank")
    for record in ({}, {"call_id": "x1", "decision": "execute", "reason": "forged"}):
        reviewer = Reviewer(False)
        async with Toolbox({"bank": suite.build_server()}) as toolbox:
            graph = create_envace_graph().compile(checkpointer=InMemorySaver())
            context = EnvaceContext(policy=ScriptedPolicy(act=["Done."] * 3), toolbox=toolbox.scoped(episode.meta),
                                    approve=reviewer, mode=mode)
            config = {"configurable": {"thread_id": f"{mode}-{bool(record)}"}}
            await graph.ainvoke(Command(goto=Send("act", {"call": raw, "record": record})), config, context=context)
            assert await episode.final_state(toolbox) == task.initial_state
        assert [r["name"] for r in reviewer.shown] == (["transfer"] if mode == "real" else [])


async def test_a_tool_node_over_a_plain_message_list_still_refuses_shared_ids(bank):
    from typing import Annotated

    from langgraph.graph.message import add_messages

    suite, task = bank
    accounts = mine(task)
    two = AIMessage(content="", tool_calls=[
        {"name": "transfer", "args": {"from_account_id": accounts["checking"], "to_account_id": accounts["savings"],
                                      "amount": amount}, "id": "c1"} for amount in (1.0, 2.0)])
    reviewer = Reviewer(True, True)
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        builder = StateGraph(Annotated[list, add_messages])
        builder.add_node("tools", RehearsingToolNode(toolbox.scoped(episode.meta), ScriptedPolicy(), approve=reviewer,
                                                     gate=GateConfig(rehearse="none")))
        builder.add_edge(START, "tools")
        await builder.compile().ainvoke([HumanMessage(content=task.instruction), two])
        assert await episode.final_state(toolbox) == task.initial_state
    assert reviewer.shown == []


def test_characters_that_draw_nothing_are_written_out_in_what_a_reviewer_reads():
    from envace_mcp._text import visible

    for hidden in ("\u034f", "\u3164", "\ufe0f", "\U000e0100", "\u00a0", "\u2800", "\u200b", "\u202e"):
        assert visible(f"ali{hidden}ce") != "alice" and "\\" in visible(f"ali{hidden}ce")
    assert visible("café नमस्ते") == "café नमस्ते"  # letters and marks of real scripts stay as written


async def test_a_tool_node_without_a_record_key_still_keeps_to_the_real_call_budget(bank):
    suite, task = bank
    accounts = mine(task)
    reads = [AIMessage(content="", tool_calls=[{"name": "get_balance", "args": {"account_id": accounts["savings"]},
                                                "id": f"r{i}"}]) for i in range(3)]
    model = ToolCallingFake(messages=iter([*reads, AIMessage(content="Done.")]))
    episode = Episode(task, "bank")
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        node = RehearsingToolNode(toolbox.scoped(episode.meta), ScriptedPolicy(),
                                  gate=GateConfig(require_approval="never"), limits=RunLimits(max_real_calls=2))
        out = await hand_built(model, node).ainvoke({"messages": [HumanMessage(content=task.instruction)]})
    replies = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in replies] == ["success", "success", "error"]
    assert "Not executed (budget)" in replies[2].content


async def test_an_approval_shows_the_arguments_a_scope_binds_not_only_what_the_model_wrote():
    """A scope's bound arguments replace the model's (`toolbox.scoped(bind=...)`): the reviewer sees the
    values the server will receive, in the graph and in the middleware."""
    from langchain.agents import create_agent
    from probe_server import build as build_probe

    from envace_mcp.graph.middleware import RehearsalMiddleware
    from envace_mcp.policy.prompts import tool_call_text

    probe = build_probe()
    basket = {"customer": "model wrote this", "lines": [{"sku": "A", "qty": 1}]}
    for form in ("graph", "middleware"):
        reviewer = Reviewer(False)
        async with Toolbox({"probe": probe}) as toolbox:
            scope = toolbox.scoped(bind={"basket": {"customer": "bound-by-operator", "lines": [{"sku": "B", "qty": 2}]}})
            start = {"messages": [HumanMessage(content="check out")]}
            if form == "graph":
                await create_envace_graph().compile().ainvoke(start, context=EnvaceContext(
                    policy=ScriptedPolicy(act=[tool_call_text("checkout", {}), "Done."]), toolbox=scope,
                    approve=reviewer, gate=GateConfig(rehearse="none")))
            else:
                model = ToolCallingFake(messages=iter([AIMessage(content="", tool_calls=[
                    {"name": "checkout", "args": {"basket": basket}, "id": "k1"}]), AIMessage(content="Done.")]))
                tools = scope.langchain_tools()
                await create_agent(model, tools=tools, middleware=[RehearsalMiddleware(
                    ScriptedPolicy(), tools=tools, approve=reviewer, gate=GateConfig(rehearse="none"))]).ainvoke(start)
        (shown,) = reviewer.shown
        assert shown["args"]["basket"]["customer"] == "bound-by-operator", form
        assert "bound-by-operator" in shown["description"] and "model wrote this" not in shown["description"], form
    assert probe.calls == []  # both refused by the reviewer
