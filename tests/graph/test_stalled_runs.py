"""A run that cannot progress stops and says so: the agent proposes a call the gate keeps stopping (a
made-up id, issue 51), and the run ends at the third stop of that call since the user's last message,
without more turns or rehearsals, the reason in its state, its trace and the CLI's output. A real
to-do server (tests/todo_server.py) in-process, or over stdio for the CLI; scripted models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
from envace_mcp.graph.tool_node import RehearsingToolNode
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox
from envace_mcp.traces import record_run
from todo_server import TODOS, build

pytestmark = pytest.mark.anyio
TASK = "Delete my to-do item about filing taxes."
TODO_SERVER = str(Path(__file__).parent.parent / "todo_server.py")
GATE_REASON = "destructive call blocked: rehearsal predicts NOT_FOUND: no to-do with id 't9'"
STOPPED = f'stopped: the agent proposed delete_todo {{"id": "t9"}} 3 times and the gate stopped it each time: {GATE_REASON}'
WILL_NOT_RUN = "This exact call was stopped 3 times since the user's last message and will not run: do not propose it again"


def delete(todo_id: str) -> str:
    return f'<tool_call>{{"name": "delete_todo", "arguments": {{"id": "{todo_id}"}}}}</tool_call>'


def not_found(todo_id: str) -> str:
    return ('<execution_result>{"error_tool_call": {"code": "NOT_FOUND", '
            f'"message": "no to-do with id \'{todo_id}\'"}}}}</execution_result>')


async def test_a_call_the_gate_stops_a_third_time_ends_the_run_with_the_reason_in_state_and_trace():
    """Issue 51: the agent would propose the same made-up id ten times; the run ends at the third stop."""
    policy = ScriptedPolicy(act=[delete("t9")] * 10, rehearse=[not_found("t9")] * 10)
    server = build()
    async with Toolbox({"todo": server}) as toolbox:
        out, trace = await record_run(create_envace_graph().compile(), {"messages": [HumanMessage(content=TASK)]},
                                      context=EnvaceContext(policy=policy, toolbox=toolbox))
    assert out["status"] == "stalled" and out["final_answer"] is None
    assert out["stop_reason"] == STOPPED
    # three turns and three rehearsals of the ten the model had ready: it stopped early, not at max_steps (12)
    assert out["steps"] == 3 and out["rehearsal_count"] == 3 and out.get("real_calls", 0) == 0
    assert [role for role, _ in policy.calls] == ["act", "rehearse"] * 3
    assert server.todos == TODOS  # nothing reached the server
    assert [s.decision for s in trace.steps_of("gate")] == ["block"] * 3 and len(trace.steps_of("rehearse")) == 3
    assert trace.final_answer is None and trace.metadata["stop_reason"] == STOPPED and trace.error is None
    first, _, third = trace.steps_of("tool")
    assert first.reason == GATE_REASON  # the first two stops are the gate's own
    assert third.reason == f"{GATE_REASON}. {WILL_NOT_RUN}"  # the third says the run stops on it
    assert WILL_NOT_RUN in third.result["content"][0]["text"]


async def test_calls_stopped_fewer_than_three_times_each_let_the_agent_go_on_to_an_answer():
    policy = ScriptedPolicy(act=[delete("t9"), delete("t9"), delete("t8"), delete("t8"), "I could not find that to-do."],
                            rehearse=[not_found("t9")] * 2 + [not_found("t8")] * 2)
    async with Toolbox({"todo": build()}) as toolbox:
        out = await create_envace_graph().compile().ainvoke({"messages": [HumanMessage(content=TASK)]},
                                                             context=EnvaceContext(policy=policy, toolbox=toolbox))
    policy.assert_complete()
    assert out["status"] == "finished" and out["final_answer"] == "I could not find that to-do."
    assert out.get("stop_reason") is None
    assert [r["decision"] for r in out["rehearsals"]] == ["block"] * 4
    assert not any("will not run" in r["reason"] for r in out["rehearsals"])


async def test_a_new_message_from_the_user_starts_the_count_again():
    policy = ScriptedPolicy(act=[delete("t9")] * 3 + [delete("t9"), "It is not there; which one did you mean?"],
                            rehearse=[not_found("t9")] * 4)
    graph = create_envace_graph().compile(checkpointer=InMemorySaver())
    thread = {"configurable": {"thread_id": "t"}}
    async with Toolbox({"todo": build()}) as toolbox:
        context = EnvaceContext(policy=policy, toolbox=toolbox)
        stalled = await graph.ainvoke({"messages": [HumanMessage(content=TASK)]}, thread, context=context)
        again = await graph.ainvoke({"messages": [HumanMessage(content="Try t9 once more, please.")]}, thread,
                                    context=context)
    policy.assert_complete()
    assert stalled["status"] == "stalled" and stalled["stop_reason"] == STOPPED
    # stopped once since the user's new message: the agent goes on, and the earlier reason is gone
    assert again["status"] == "finished" and again["final_answer"].startswith("It is not there")
    assert again["stop_reason"] is None
    assert not again["rehearsals"][-1]["reason"].endswith("do not propose it again")


async def test_a_call_whose_approval_is_refused_three_times_ends_the_run_too():
    """A world model whose word the gate does not act on (no trust measured for the tool) lets the call through to
    approval; nobody there to approve it three times is as final as three blocks."""
    asked = []

    def nobody(request: dict) -> dict:
        asked.append(request["args"])
        return {"type": "reject", "message": "nobody could be asked"}

    policy = ScriptedPolicy(act=[delete("t9")] * 10,
                            rehearse=['<execution_result>{"deleted": "t9", "remaining": 1}</execution_result>'] * 10)
    server = build()
    async with Toolbox({"todo": server}) as toolbox:
        out = await create_envace_graph().compile().ainvoke(
            {"messages": [HumanMessage(content=TASK)]}, context=EnvaceContext(policy=policy, toolbox=toolbox, approve=nobody))
    assert asked == [{"id": "t9"}] * 3 and out["status"] == "stalled" and out["rehearsal_count"] == 3
    assert out["stop_reason"] == ('stopped: the agent proposed delete_todo {"id": "t9"} 3 times and it was not run any '
                                  "of those times: the call was not approved. Reason: nobody could be asked")
    assert server.todos == TODOS


class ToolCallingFake(GenericFakeChatModel):
    """A real BaseChatModel with scripted replies that accepts `bind_tools`."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFake:
        return self


def proposals(n: int) -> list[AIMessage]:
    return [AIMessage(content="", tool_calls=[{"name": "delete_todo", "args": {"id": "t9"}, "id": f"c{i}"}])
            for i in range(n)]


async def test_the_middleware_ends_create_agents_loop_at_the_third_stop_of_one_call():
    from langchain.agents import create_agent

    from envace_mcp.graph.middleware import RehearsalMiddleware

    model = ToolCallingFake(messages=iter(proposals(10)))
    policy = ScriptedPolicy(rehearse=[not_found("t9")] * 10)
    server = build()
    async with Toolbox({"todo": server}) as toolbox:
        tools = toolbox.langchain_tools()
        agent = create_agent(model, tools=tools, middleware=[RehearsalMiddleware(policy, tools=tools)])
        out = await agent.ainvoke({"messages": [HumanMessage(content=TASK)]})
    assert out["stop_reason"] == STOPPED
    assert len([m for m in out["messages"] if isinstance(m, AIMessage)]) == 3  # no fourth model call
    replies = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [r.additional_kwargs["envace_rehearsal"]["decision"] for r in replies] == ["block"] * 3
    assert WILL_NOT_RUN in replies[-1].content and WILL_NOT_RUN not in replies[1].content
    assert len(policy.calls) == 3 and server.todos == TODOS


async def test_the_rehearsing_tool_node_tells_the_agent_and_a_router_can_end_the_loop():
    model = ToolCallingFake(messages=iter(proposals(10)))
    policy = ScriptedPolicy(rehearse=[not_found("t9")] * 10)
    async with Toolbox({"todo": build()}) as toolbox:
        tools = RehearsingToolNode(toolbox, policy, gate=GateConfig(require_approval="never"))

        async def call_model(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        builder = StateGraph(MessagesState)
        builder.add_node("agent", call_model)
        builder.add_node("tools", tools)
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_conditional_edges("tools", lambda state: END if tools.stalled(state) else "agent")
        out = await builder.compile().ainvoke({"messages": [HumanMessage(content=TASK)]})
    replies = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len(replies) == 3 and WILL_NOT_RUN in replies[-1].content
    assert tools.stalled(out) == STOPPED and len(policy.calls) == 3


# `envace run` as a user runs it, its model scripted (as tests/cli/test_terminal_pty.py drives it)
DRIVER = """
import json, os, sys
import envace_mcp.policy
from envace_mcp.testing import ScriptedPolicy
script = json.loads(os.environ["ENVACE_TEST_SCRIPT"])
envace_mcp.policy.load_policy = lambda *args, **kwargs: ScriptedPolicy(**script)
from envace_mcp.cli import main
main(sys.argv[1:])
"""


def envace_run(tmp_path: Path, act: list[str], rehearse: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    state = tmp_path / "todos.json"
    state.write_text(json.dumps(TODOS))
    servers = tmp_path / "mcp.json"
    servers.write_text(json.dumps({"mcpServers": {"todo": {"command": sys.executable, "args": [TODO_SERVER],
                                                           "env": {"TODO_STATE": str(state)}}}}))
    out = subprocess.run([sys.executable, "-c", DRIVER, "run", TASK, "--servers", str(servers)],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                         env={"COLUMNS": "300", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
                              "ENVACE_TEST_SCRIPT": json.dumps({"act": act, "rehearse": rehearse})})
    return out, state


def test_envace_run_says_why_a_run_ended_without_an_answer_and_exits_1(tmp_path):
    out, state = envace_run(tmp_path, act=[delete("t9")] * 10, rehearse=[not_found("t9")] * 10)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"final answer: none — {STOPPED}" in out.stdout
    assert "(stalled, 0 real call(s), 3 rehearsal(s))" in out.stdout
    assert json.loads(state.read_text()) == TODOS
    answered, _ = envace_run(tmp_path, act=[delete("t9"), "There is no to-do t9."], rehearse=[not_found("t9")])
    assert answered.returncode == 0, answered.stdout + answered.stderr
    assert "final answer: There is no to-do t9." in answered.stdout
