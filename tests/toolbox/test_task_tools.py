"""Long-running tools: a tool the server runs as an MCP task (tasks extension, 2026-07-28) works through the
toolbox and the graph — created, polled, its final result returned; cancelled when the call ends early;
a server that lies about its task gets its task cancelled and an escaped, bounded error. Real servers
(tests/servers/task_server.py) in-process and over streamable HTTP."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from langchain_core.messages import HumanMessage
from mcp import Client

from envace_mcp.envs.launch import free_port, wait_for_port
from envace_mcp.graph import EnvaceContext, create_envace_graph
from envace_mcp.policy.prompts import tool_call_text
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox
from envace_mcp.toolbox.tasks import MAX_SAID_CHARS, TaskPolicy, TasksClient
from envace_mcp.traces.recorder import record_run

pytestmark = pytest.mark.anyio
TASK_SERVER = str(Path(__file__).parents[1] / "servers" / "task_server.py")
_spec = importlib.util.spec_from_file_location("task_server", TASK_SERVER)
task_server = sys.modules.setdefault("task_server", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(task_server)
build, HOSTILE = task_server.build, task_server.HOSTILE


class Reviewer:
    def __init__(self, answer: bool) -> None:
        self.answer, self.shown = answer, []

    def __call__(self, request):
        self.shown.append(request)
        return self.answer


async def test_a_task_tool_returns_its_final_result_and_the_tasks_life():
    server = build()
    async with Toolbox({"jobs": server}) as toolbox:
        with anyio.fail_after(10):
            result = await toolbox.call("report", {"text": "q3"})
            plain = await toolbox.call("stats")
    assert not result.is_error and result.text == "report on q3: all good"
    assert result.structured_content == {"result": "report on q3: all good"}
    life = result.task
    assert life["final_status"] == "completed" and life["polls"] == 2 and not life["cancel_sent"]
    assert [status for status, _ in life["statuses"]] == ["working", "completed"]
    assert server.tasks.created == ["report"] and server.tasks.polls == 2 and server.tasks.cancels == []
    assert plain.task is None  # a tool the server answers directly carries no task


async def test_polling_honours_the_servers_interval_within_a_floor_and_a_cap():
    server = build()
    async with Toolbox({"jobs": server}) as toolbox:
        with anyio.fail_after(10):
            patient = await toolbox.call("patient", {})  # pollIntervalMs 300, two polls
            forever = await toolbox.call("forever", {}, timeout=0.5)  # pollIntervalMs 1: the floor (50 ms) holds
    assert not patient.is_error and patient.latency_s >= 0.55
    assert forever.task["polls"] <= 11
    # pollIntervalMs of 10**9: the cap decides when the next poll comes
    async with Client(build(), extensions=[TasksClient(TaskPolicy(cap_s=0.1))]) as client:
        with anyio.fail_after(5):
            sleepy = await client.call_tool("sleepy", {})
    assert not sleepy.is_error and sleepy.content[0].text == "never seen"


async def test_a_task_that_never_ends_times_out_and_is_cancelled_at_the_server():
    server = build()
    async with Toolbox({"jobs": server}) as toolbox:
        with anyio.fail_after(10):
            result = await toolbox.call("forever", {}, timeout=0.4)
            after = await toolbox.call("report", {"text": "next"})
    assert result.error_kind == "timeout" and "timed out after 0.4 s" in result.text
    assert result.task["cancel_sent"] and result.task["final_status"] is None and result.task["polls"] >= 2
    assert len(server.tasks.cancels) == 1 and not after.is_error  # the toolbox stays usable


async def test_failed_and_cancelled_tasks_are_error_results_with_the_servers_message_escaped_and_bounded():
    async with Toolbox({"jobs": build()}) as toolbox:
        with anyio.fail_after(10):
            crash = await toolbox.call("crash", {})
            refused = await toolbox.call("refused", {})
    assert crash.is_error and crash.error_kind == "tool_error" and crash.task["final_status"] == "failed"
    assert "failed with error -32603" in crash.text and "\\x1b[2J" in crash.text
    assert "\x1b" not in crash.text and "\x07" not in crash.text
    assert len(crash.text) < MAX_SAID_CHARS + 200 < len(HOSTILE)
    assert refused.is_error and "was cancelled by the server: operator said no" in refused.text


async def test_a_server_whose_tasks_get_lies_has_its_task_cancelled_and_the_call_fails():
    server = build()
    async with Toolbox({"jobs": server}) as toolbox:
        with anyio.fail_after(10):
            shifty = await toolbox.call("shifty", {})  # tasks/get: a status the extension does not have
            impostor = await toolbox.call("impostor", {})  # tasks/get: another task's id
    assert shifty.is_error and "unknown status 'exploding\\x1b[31m'" in shifty.text and "\x1b" not in shifty.text
    assert impostor.is_error and "about another task 'someone-else'" in impostor.text
    assert shifty.task["cancel_sent"] and impostor.task["cancel_sent"]
    assert len(server.tasks.cancels) == 2


async def test_cancelling_the_caller_mid_poll_cancels_the_task_first():
    server = build()
    async with Toolbox({"jobs": server}) as toolbox:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(toolbox.call, "forever", {})
                while server.tasks.polls < 2:
                    await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
        assert server.tasks.created == ["forever"] and len(server.tasks.cancels) == 1
        assert not (await toolbox.call("report", {"text": "x"})).is_error


@pytest.fixture(params=["stdio", "http"])
def task_server_config(request):
    """The task server out of process, as a toolbox server entry."""
    if request.param == "stdio":
        yield {"command": sys.executable, "args": [TASK_SERVER]}
        return
    port = free_port()
    proc = subprocess.Popen([sys.executable, TASK_SERVER, "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_for_port(port, proc, 30)
        yield {"url": f"http://127.0.0.1:{port}/mcp"}
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


async def test_task_tools_work_over_stdio_and_streamable_http(task_server_config):
    async with Toolbox({"jobs": task_server_config}) as toolbox:
        with anyio.fail_after(20):
            report = await toolbox.call("report", {"text": "http"})
            forever = await toolbox.call("forever", {}, timeout=0.4)
            stats = await toolbox.call("stats")
    assert report.text == "report on http: all good" and report.task["final_status"] == "completed"
    assert forever.error_kind == "timeout" and forever.task["cancel_sent"]
    assert stats.structured_content["created"] == ["report", "forever"] and stats.structured_content["cancels"] == 1


# ------------------------------------------------------------------ the graph: gate at creation, train on the end

async def test_a_destructive_task_tool_needs_approval_and_a_refused_one_never_creates_a_task():
    for answer in (False, True):
        server, reviewer = build(), Reviewer(answer)
        policy = ScriptedPolicy(act=[tool_call_text("wipe", {"table": "users"}), "Done."],
                                rehearse=["<execution_result>wiped users</execution_result>"])
        async with Toolbox({"jobs": server}) as toolbox:
            with anyio.fail_after(20):
                _, trace = await record_run(create_envace_graph().compile(),
                                            {"messages": [HumanMessage(content="wipe the users table")]},
                                            context=EnvaceContext(policy=policy, toolbox=toolbox, approve=reviewer))
        assert [r["name"] for r in reviewer.shown] == ["wipe"]
        (step,) = [s for s in trace.steps if s.role == "tool"]
        if not answer:
            assert server.tasks.created == [] and step.result.get("task") is None
            continue
        assert server.tasks.created == ["wipe"]
        # what the world model trains on is the task's final result, never its handle
        assert step.result["content"] == [{"type": "text", "text": "wiped users"}] and not step.result["is_error"]
        assert step.result["task"]["final_status"] == "completed"


@pytest.mark.parametrize("suggested, waited", [(10**400, 5.0), (-(10**400), 0.05), (float("nan"), 1.0), ("1", 1.0),
                                               (True, 1.0), (0, 0.05), (250, 0.25)])
def test_any_suggested_poll_interval_a_server_sends_becomes_a_wait_within_the_floor_and_the_cap(suggested, waited):
    from envace_mcp.toolbox.tasks import TaskPolicy

    assert TaskPolicy().wait(suggested) == waited
