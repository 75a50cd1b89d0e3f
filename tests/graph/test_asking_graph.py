"""A tool that asks mid-call, in every form: the EnvACE graph pauses in the approval shape
(`tool_input`) and resumes with the answers, an in-process approver answers inside the run, and
`RehearsalMiddleware` does the same in `create_agent`. The answer is part of the call: approval still
comes first, a rejected call is never sent, and the questions and answers are on the record, the trace
and the call's `traceparent`. Real MCP servers in-process; scripted models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations as Hints
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult

from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import TraceStore, record_run
from envace_mcp.traces.context import traceparent

pytestmark = pytest.mark.anyio
NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def vault() -> MCPServer:
    """A destructive tool that asks the person to type the box's name before it wipes it; every round it
    is sent, and every box wiped, is kept on the server."""
    server = MCPServer("vault", log_level="WARNING")
    server.rounds, server.wiped, server.traceparents = [], [], []  # type: ignore[attr-defined]

    @server.tool(annotations=Hints(destructive_hint=True))
    async def wipe(box: str, ctx: Context) -> str | InputRequiredResult:
        """Wipe a box, once the person confirms its name."""
        answers = ctx.input_responses or {}
        server.rounds.append({k: v.action for k, v in answers.items()})  # type: ignore[attr-defined]
        server.traceparents.append((ctx.request_context.meta or {}).get("traceparent"))  # type: ignore[attr-defined]
        if "confirm" not in answers:
            ask = ElicitRequest(params=ElicitRequestFormParams(message=f"Type \x1b[31m{box}\x1b[0m to wipe it",
                                                               requested_schema=NAME))
            return InputRequiredResult(input_requests={"confirm": ask}, request_state="asked")
        answer = answers["confirm"]
        if answer.action != "accept" or (answer.content or {}).get("name") != box:
            raise ToolError(f"not confirmed ({answer.action})")
        server.wiped.append(box)  # type: ignore[attr-defined]
        return f"wiped {box}"

    return server


def policy() -> ScriptedPolicy:
    wipe = '<tool_call>{"name": "wipe", "arguments": {"box": "b1"}}</tool_call>'
    return ScriptedPolicy(act=[wipe, "Done."], rehearse=['<execution_result>"wiped b1"</execution_result>'])


CONFIRM = {"type": "respond", "responses": {"confirm": {"action": "accept", "content": {"name": "b1"}}}}


async def test_the_graph_asks_approval_then_the_tools_question_and_resuming_sends_nothing_twice():
    server, scripted = vault(), policy()
    async with Toolbox({"vault": server}) as toolbox:
        graph = create_envace_graph().compile(checkpointer=InMemorySaver())
        context = EnvaceContext(policy=scripted, toolbox=toolbox, gate=GateConfig(require_approval="destructive"))
        config = {"configurable": {"thread_id": "t"}}
        paused = await graph.ainvoke({"messages": [HumanMessage(content="Wipe box b1.")]}, config, context=context)
        (approval,) = paused["__interrupt__"]
        assert approval.value["type"] == "tool_approval" and server.rounds == []  # nothing sent unapproved
        paused = await graph.ainvoke(Command(resume={approval.id: {"type": "approve"}}), config, context=context)
        (question,) = paused["__interrupt__"]
        request = question.value
        assert request["type"] == "tool_input" and request["name"] == "wipe" and request["args"] == {"box": "b1"}
        assert request["questions"][0]["key"] == "confirm" and request["rehearsal"] is not None  # what was rehearsed
        assert "Type \\x1b[31mb1\\x1b[0m to wipe it" in request["description"] and "\x1b" not in request["description"]
        assert server.rounds == [{}]
        out = await graph.ainvoke(Command(resume={question.id: CONFIRM}), config, context=context)
    scripted.assert_complete()  # one rehearsal: resuming twice rehearsed nothing again
    assert server.rounds == [{}, {"confirm": "accept"}] and server.wiped == ["b1"]  # the first round was not re-sent
    (record,) = out["rehearsals"]
    assert record["decision"] == "ask" and record["approved"] is True and record["real"]["is_error"] is False
    assert record["asked"] == [{"round": 1, "questions": request["questions"],
                                "answers": {"confirm": {"action": "accept", "content": {"name": "b1"}}}}]
    assert out["final_answer"] == "Done."


async def test_answers_that_do_not_fit_ask_again_saying_why_and_the_call_goes_on_with_the_next():
    """A typo in an answer (a key the tool did not ask, a form field missing) does not end the call: the
    same questions come back with the problem, and the next answers continue it."""
    server = vault()
    async with Toolbox({"vault": server}) as toolbox:
        graph = create_envace_graph().compile(checkpointer=InMemorySaver())
        context = EnvaceContext(policy=policy(), toolbox=toolbox, gate=GateConfig(require_approval="destructive"))
        config = {"configurable": {"thread_id": "typo"}}
        paused = await graph.ainvoke({"messages": [HumanMessage(content="Wipe box b1.")]}, config, context=context)
        paused = await graph.ainvoke(Command(resume={paused["__interrupt__"][0].id: {"type": "approve"}}), config,
                                     context=context)
        wrong = {"type": "respond", "responses": {"confirn": {"action": "accept", "content": {"name": "b1"}}}}
        paused = await graph.ainvoke(Command(resume={paused["__interrupt__"][0].id: wrong}), config, context=context)
        (again,) = paused["__interrupt__"]
        assert again.value["type"] == "tool_input" and "no answer for 'confirm'" in again.value["problem"]
        assert "Asked again:" in again.value["description"] and server.rounds == [{}]  # nothing sent for the typo
        empty = {"type": "respond", "responses": {"confirm": {"action": "accept", "content": {}}}}
        paused = await graph.ainvoke(Command(resume={again.id: empty}), config, context=context)
        (third,) = paused["__interrupt__"]
        assert "does not fit its form" in third.value["problem"] and "'name' is a required property" in third.value["problem"]
        out = await graph.ainvoke(Command(resume={third.id: CONFIRM}), config, context=context)
    assert server.wiped == ["b1"] and server.rounds == [{}, {"confirm": "accept"}]
    assert out["rehearsals"][0]["asked"][0]["answers"]["confirm"]["content"] == {"name": "b1"}


async def test_an_approver_in_the_context_answers_the_question_inside_the_run():
    server, scripted = vault(), policy()
    shown: list[dict[str, Any]] = []

    def approve(request: dict[str, Any]) -> Any:
        shown.append(request)
        return {"type": "approve"} if request["type"] == "tool_approval" else CONFIRM

    async with Toolbox({"vault": server}) as toolbox:
        out = await create_envace_graph().compile().ainvoke(
            {"messages": [HumanMessage(content="Wipe box b1.")]},
            context=EnvaceContext(policy=scripted, toolbox=toolbox, approve=approve))
    assert [r["type"] for r in shown] == ["tool_approval", "tool_input"] and server.wiped == ["b1"]
    assert out["rehearsals"][0]["asked"][0]["answers"]["confirm"]["action"] == "accept"


@pytest.mark.parametrize("answer", [{"type": "reject", "message": "not now"}, True, {"type": "approve"},
                                    {"type": "respond", "responses": {"confirm": {"action": "accept"}}}])
async def test_a_question_rejected_or_answered_with_anything_but_answers_goes_no_further(answer):
    server = vault()
    async with Toolbox({"vault": server}) as toolbox:
        out = await create_envace_graph().compile().ainvoke(
            {"messages": [HumanMessage(content="Wipe box b1.")]},
            context=EnvaceContext(policy=policy(), toolbox=toolbox,
                                  approve=lambda r: True if r["type"] == "tool_approval" else answer))
    assert server.rounds == [{}] and server.wiped == []
    record = out["rehearsals"][0]
    assert record["decision"] == "rejected_by_human" and record["asked"][0]["answers"] is None
    reply = next(m for m in out["messages"] if getattr(m, "tool_call_id", None) == record["call_id"])
    assert reply.status == "error" and reply.content.startswith("Not finished: the tool asked for input")


async def test_answers_given_for_an_approval_cannot_approve_a_call_and_a_rejected_call_never_asks():
    server = vault()
    async with Toolbox({"vault": server}) as toolbox:
        out = await create_envace_graph().compile().ainvoke(
            {"messages": [HumanMessage(content="Wipe box b1.")]},
            context=EnvaceContext(policy=policy(), toolbox=toolbox, approve=lambda r: CONFIRM))
    assert server.rounds == [] and out["rehearsals"][0]["decision"] == "rejected_by_human"


async def test_a_recorded_run_carries_its_traceparent_to_every_round_and_keeps_the_questions_in_its_trace(tmp_path):
    server = vault()
    async with Toolbox({"vault": server}) as toolbox:
        state, trace = await record_run(
            create_envace_graph().compile(), {"messages": [HumanMessage(content="Wipe box b1.")]},
            context=EnvaceContext(policy=policy(), toolbox=toolbox,
                                  approve=lambda r: True if r["type"] == "tool_approval" else CONFIRM))
    call_id = state["rehearsals"][0]["call_id"]
    assert server.traceparents == [traceparent(trace.run_id, f"call:{call_id}")] * 2
    (tool,) = trace.steps_of("tool")
    assert tool.asked[0]["questions"][0]["message"] == "Type \x1b[31mb1\x1b[0m to wipe it"
    assert tool.asked[0]["answers"] == CONFIRM["responses"]
    assert tool.decision == "ask" and tool.approved is True and tool.edited is None  # what the person said
    TraceStore(tmp_path).append(trace)
    shown = subprocess.run([sys.executable, "-m", "envace_mcp.cli", "traces", "show", trace.run_id, "--dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0 and "approved" in shown.stdout and "tool asks (round 1)" in shown.stdout
    assert "\x1b" not in shown.stdout and "Type \\x1b[31mb1" in shown.stdout


class ToolCallingFake(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFake:
        return self


async def test_create_agent_with_the_middleware_pauses_for_the_question_and_resumes_with_the_answers():
    from langchain.agents import create_agent

    from envace_mcp.graph.middleware import RehearsalMiddleware

    server = vault()
    wipe = AIMessage(content="", tool_calls=[{"name": "wipe", "args": {"box": "b1"}, "id": "w1"}])
    model = ToolCallingFake(messages=iter([wipe, AIMessage(content="Wiped.")]))
    async with Toolbox({"vault": server}) as toolbox:
        tools = toolbox.langchain_tools()
        scripted = ScriptedPolicy(rehearse=['<execution_result>"wiped b1"</execution_result>'])
        agent = create_agent(model, tools=tools, middleware=[RehearsalMiddleware(scripted, tools=tools)],
                             checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "t"}}
        paused = await agent.ainvoke({"messages": [HumanMessage(content="Wipe box b1.")]}, config)
        assert paused["__interrupt__"][0].value["type"] == "tool_approval" and server.rounds == []
        paused = await agent.ainvoke(Command(resume={"type": "approve"}), config)
        (question,) = paused["__interrupt__"]
        assert question.value["type"] == "tool_input" and question.value["questions"][0]["key"] == "confirm"
        out = await agent.ainvoke(Command(resume={"decisions": [CONFIRM]}), config)
    scripted.assert_complete()
    assert server.wiped == ["b1"] and out["messages"][-1].content == "Wiped."
    assert all(t is not None and t.startswith("00-") for t in server.traceparents)
    record = out["rehearsals"][0]
    assert record["asked"][0]["answers"] == CONFIRM["responses"] and json.dumps(record)


async def test_a_2025_servers_mid_call_question_goes_to_the_runs_approver_in_the_approval_shape(tmp_path):
    """A handshake-era server asks with `elicitation/create` while the call waits: with an approver in the
    context (`envace run`'s terminal, say), the graph puts it in the same `tool_input` shape, after the
    call's approval; the answer reaches the server and the record keeps both."""
    server = str(Path(__file__).parents[1] / "servers" / "asking_server.py")
    log = tmp_path / "log.jsonl"
    config = {"pay": {"command": sys.executable, "args": [server, "legacy"], "env": {"ASKING_LOG": str(log)}}}
    shown: list[dict[str, Any]] = []

    def approve(request: dict[str, Any]) -> Any:
        shown.append(request)
        if request["type"] == "tool_approval":
            return True
        return {"type": "respond", "responses": {"elicitation": {"action": "accept", "content": {"pin": "7"}}}}

    scripted = ScriptedPolicy(act=['<tool_call>{"name": "pay", "arguments": {"amount": 2}}</tool_call>', "Paid."],
                              rehearse=['<execution_result>"paid 2"</execution_result>'])
    async with Toolbox(config) as toolbox:
        out = await create_envace_graph().compile().ainvoke(
            {"messages": [HumanMessage(content="Pay 2.")]},
            context=EnvaceContext(policy=scripted, toolbox=toolbox, approve=approve))
    assert [r["type"] for r in shown] == ["tool_approval", "tool_input"]
    assert shown[1]["questions"][0]["message"] == "Enter the PIN that confirms this payment"
    assert [json.loads(line)["pin"] for line in log.read_text().splitlines()] == ["7"]
    (record,) = out["rehearsals"]
    assert record["approved"] is True and record["real"]["is_error"] is False
    assert record["asked"][0]["answers"] == {"elicitation": {"action": "accept", "content": {"pin": "7"}}}
