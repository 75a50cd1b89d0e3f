"""MCP tools as LangChain users get them, from LangChain's own libraries, behind both drop-ins: `langchain.mcp`
(mcp 2, in this environment) and langchain-mcp-adapters 0.3.2 (mcp<2: in an environment of its own, made on
first use by the very commands examples/langchain_mcp_adapters_agent.py documents, where this same module runs
the same scenario in a child process). The drop-ins read each
tool's hints, schema and server from where its library put them, so the real to-do server's read runs
unasked and its delete waits for a person who sees the rehearsed outcome.

Run as a script in the adapters' environment (`test_langchain_mcp_tools.py SERVER_PYTHON`: a python with
mcp 2, for the to-do server) it prints what the adapters' tools did, as JSON, for the parent test to check.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox.langchain import spec_from_tool

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::langchain_core._api.LangChainBetaWarning")]
ROOT = Path(__file__).resolve().parents[2]
TODO_SERVER = ROOT / "examples" / "todo_server.py"


def _example_todo() -> Any:
    """examples/todo_server.py as a module of its own name: tests/todo_server.py is another server, and
    which of the two `import todo_server` found depended on the order the tests ran in."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_todo_server", TODO_SERVER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its pydantic models resolve their annotations in it
    spec.loader.exec_module(module)
    return module
ADAPTERS_EXAMPLE = ROOT / "examples" / "langchain_mcp_adapters_agent.py"
DELETED = '<execution_result>{"id": "t2", "title": "Buy milk", "remaining": 2}</execution_result>'
ANSWERS = {"approve": {"type": "approve"}, "reject": {"type": "reject", "message": "keep the milk"}}
KINDS = {"list_todos": "read-only", "get_todo": "read-only", "add_todo": "not destructive",
         "delete_todo": "destructive"}


class ToolCallingFake(GenericFakeChatModel):
    """A real BaseChatModel with scripted replies that accepts `bind_tools`."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFake:
        return self


async def gated_delete(tools: list[Any], todo_ids: Callable[[], Awaitable[list[str]]], answer: str,
                       form: str) -> dict[str, Any]:
    """One turn that lists the to-dos and deletes t2, run by `form`'s drop-in ("middleware": create_agent
    pausing with interrupt(); "tool_node": a hand-built graph asking `approve=`) under the default gate,
    and a person's `answer`: what the person was shown, what the model was told, what the server holds."""
    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition
    from langgraph.types import Command

    from envace_mcp.graph.middleware import RehearsalMiddleware
    from envace_mcp.graph.tool_node import RehearsingToolNode

    policy = ScriptedPolicy(rehearse=[DELETED])  # one rehearsal: the read is not rehearsed
    model = ToolCallingFake(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "list_todos", "args": {}, "id": "c0"},
                                          {"name": "delete_todo", "args": {"id": "t2"}, "id": "c1"}]),
        AIMessage(content="Done.")]))
    task = {"messages": [HumanMessage(content="Delete the milk to-do.")]}
    shown: list[dict[str, Any]] = []
    if form == "middleware":
        middleware = RehearsalMiddleware(policy, tools=tools)
        specs = middleware.core.specs
        agent = create_agent(model, tools=tools, checkpointer=InMemorySaver(), middleware=[middleware])
        config = {"configurable": {"thread_id": "t"}}
        out = await agent.ainvoke(task, config)
        shown = [pause.value for pause in out.get("__interrupt__", [])]
        if shown:
            out = await agent.ainvoke(Command(resume=ANSWERS[answer]), config)
    else:
        def review(request: dict[str, Any]) -> dict[str, Any]:
            shown.append(request)
            return ANSWERS[answer]

        async def call_model(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        node = RehearsingToolNode(tools, policy, approve=review)
        specs = node.rehearsal.specs
        builder = StateGraph(MessagesState)
        builder.add_node("agent", call_model)
        builder.add_node("tools", node)
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        out = await builder.compile().ainvoke(task)
    policy.assert_complete()
    return {
        "specs": {name: {"kind": s.annotations.kind, "server": s.server, "input_schema": s.input_schema}
                  for name, s in specs.items()},
        "shown": [{"name": r["name"], "description": r["description"]} for r in shown],
        "replies": {m.name: {"status": m.status, "content": str(m.content)}
                    for m in out["messages"] if isinstance(m, ToolMessage)},
        "todos": sorted(await todo_ids()),
    }


def assert_gated(facts: dict[str, Any], answer: str, server: str) -> None:
    """The read ran unasked; the delete waited for the person, who saw its rehearsed outcome; it reached the
    server only when approved."""
    assert {name: s["kind"] for name, s in facts["specs"].items()} == KINDS
    assert {s["server"] for s in facts["specs"].values()} == {server}
    (shown,) = facts["shown"]
    assert shown["name"] == "delete_todo"
    assert "Rehearsed outcome: succeeds" in shown["description"] and "Buy milk" in shown["description"]
    replies = facts["replies"]
    assert replies["list_todos"]["status"] == "success" and "File my taxes" in replies["list_todos"]["content"]
    if answer == "approve":
        assert replies["delete_todo"]["status"] == "success" and "Buy milk" in replies["delete_todo"]["content"]
        assert facts["todos"] == ["t1", "t3"]
    else:
        assert replies["delete_todo"]["status"] == "error" and "keep the milk" in replies["delete_todo"]["content"]
        assert facts["todos"] == ["t1", "t2", "t3"]


async def listed_schemas() -> dict[str, dict[str, Any]]:
    """The to-do server's input schemas as its own `tools/list` gives them."""
    import mcp

    build_server = _example_todo().build_server

    async with mcp.Client(build_server()) as client:
        return {t.name: t.input_schema for t in (await client.list_tools()).tools}


# ------------------------------------------------------------------ langchain.mcp (mcp 2)

async def langchain_mcp_tools() -> tuple[list[Any], Any]:
    from langchain.mcp import MCPAdapter

    build_server = _example_todo().build_server

    server = build_server()
    async with MCPAdapter(server) as adapter:
        return await adapter.list_tools(), server


@pytest.mark.parametrize("answer", ["approve", "reject"])
@pytest.mark.parametrize("form", ["middleware", "tool_node"])
async def test_langchain_mcp_tools_are_gated_by_their_servers_hints_and_a_delete_runs_only_when_approved(form, answer):
    tools, server = await langchain_mcp_tools()

    async def todo_ids() -> list[str]:
        return list(server.todos)

    facts = await gated_delete(tools, todo_ids, answer, form)
    assert_gated(facts, answer, server="todo")
    assert {name: s["input_schema"] for name, s in facts["specs"].items()} == await listed_schemas()


@pytest.mark.parametrize("route", ["flag", "specs"])
async def test_hints_of_a_server_you_do_not_trust_are_ignored_so_its_read_waits_for_approval_too(route):
    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver

    from envace_mcp.graph.middleware import RehearsalMiddleware

    tools, server = await langchain_mcp_tools()
    assert {spec_from_tool(t, trust_annotations=False).annotations.kind for t in tools} == {"destructive"}
    model = ToolCallingFake(messages=iter([AIMessage(content="", tool_calls=[{"name": "list_todos", "args": {},
                                                                              "id": "c0"}])]))
    policy = ScriptedPolicy(rehearse=['<execution_result>{"todos": []}</execution_result>'])
    middleware = (RehearsalMiddleware(policy, tools=tools, trust_annotations=False) if route == "flag" else
                  RehearsalMiddleware(policy, tools=[spec_from_tool(t, trust_annotations=False) for t in tools]))
    agent = create_agent(model, tools=tools, checkpointer=InMemorySaver(), middleware=[middleware])
    out = await agent.ainvoke({"messages": [HumanMessage(content="What is left?")]},
                              {"configurable": {"thread_id": "t"}})
    (pause,) = out["__interrupt__"]
    assert pause.value["name"] == "list_todos" and "destructive" in pause.value["reason"]
    policy.assert_complete()


def test_other_tools_keep_their_reading_and_only_true_or_false_counts_as_a_hint():
    from langchain_core.tools import StructuredTool

    def tool(metadata: dict[str, Any] | None) -> StructuredTool:
        def lookup(q: str) -> str:
            """Look something up."""
            return q

        return StructuredTool.from_function(lookup, metadata=metadata)

    plain = spec_from_tool(tool(None))
    assert (plain.annotations.kind, plain.server, plain.input_schema["required"]) == ("destructive", "langchain", ["q"])
    ours = spec_from_tool(tool({"annotations": {"read_only": True}, "server": "mine"}))
    assert (ours.annotations.kind, ours.server) == ("read-only", "mine")
    for claim in ({"readOnlyHint": "true"}, {"readOnlyHint": 1}, {"readOnlyHint": True, "destructiveHint": True},
                  {"mcp": {"tool": {"annotations": {"read_only_hint": "yes"}}, "server": {"name": 7}}},
                  {"mcp": {"tool": {"annotations": {"read_only_hint": True, "destructive_hint": True}}}}):
        spec = spec_from_tool(tool(claim))
        assert (spec.annotations.kind, spec.server) == ("destructive", "langchain"), claim
    adapters = spec_from_tool(tool({"readOnlyHint": True, "destructiveHint": None, "_meta": {"x": 1}}))
    assert adapters.annotations.kind == "read-only"


# ------------------------------------------------------------------ langchain-mcp-adapters 0.3.2 (mcp<2)

def recipe() -> list[str]:
    """The shell commands in the adapters example's docstring, in order, as its source spells them (the lines
    indented by four spaces; a line ending in a backslash goes on in the next)."""
    text = ADAPTERS_EXAMPLE.read_text()
    lines = [line[4:] for line in text[3:text.index('"""', 3)].splitlines() if line.startswith("    ")]
    commands: list[str] = []
    for line in lines:
        if commands and commands[-1].endswith("\\"):
            commands[-1] += "\n" + line
        else:
            commands.append(line)
    assert len(commands) > 1 and str(ADAPTERS_EXAMPLE.relative_to(ROOT)) in commands[-1], commands  # setup, then run
    return commands


def run_as_documented(command: str, venv: Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """One of `recipe()`'s commands in bash, from the repository's root, as the example tells a user to run it:
    `python` is this environment's, and the adapters' environment is `venv` instead of /tmp/lma."""
    script = f'python() {{ {shlex.quote(sys.executable)} "$@"; }}\n' + command.replace("/tmp/lma", str(venv))
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          **kwargs)


def adapters_venv() -> Path:
    """The adapters' environment, made by the example's own setup commands (all but the last, which runs it) on
    first use under ENVACE_CACHE (~/.cache/envace-mcp). It sees this environment's site-packages after its own,
    so it holds only what the adapters need that this one lacks or has at another version (mcp 1.x, ...):
    one copy of everything else (langchain, langgraph, envace_mcp), at the versions tested here. Named by the
    commands and by this environment, whose packages it reads."""
    setup = recipe()[:-1]
    key = hashlib.sha256(repr((setup, sysconfig.get_paths()["purelib"])).encode()).hexdigest()[:12]
    venv = Path(os.environ.get("ENVACE_CACHE", Path.home() / ".cache" / "envace-mcp")) / f"venv-lma-{key}"
    if not (venv / ".complete").exists():  # a half-made one (an install cut short) is made again
        shutil.rmtree(venv, ignore_errors=True)
        for command in setup:
            done = run_as_documented(command, venv, timeout=600)
            if done.returncode != 0 and " pip " in command:
                pytest.skip(f"could not install langchain-mcp-adapters into {venv} (no network?): {done.stderr[-600:]}")
            assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
        (venv / ".complete").touch()
    return venv


def test_the_docs_give_the_adapters_recipe_the_example_runs():
    """docs/graph.md's commands for the adapters are the example's, which the tests below run: the two cannot
    drift apart, so what a reader copies from either is what was tested."""
    page = (ROOT / "docs" / "graph.md").read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", page, re.S) if "langchain-mcp-adapters" in b]
    assert blocks == ["\n".join(recipe()) + "\n"]


def test_the_adapters_recipe_installs_only_what_this_environment_lacks_and_leaves_it_alone():
    """mcp 1.x goes into the adapters' environment, ahead of this one's mcp 2, which stays where it was; what
    mcp 1.x needs beside it (pydantic-settings, which mcp 2 dropped) is there to import."""
    from importlib.metadata import version

    here, venv = version("mcp"), adapters_venv()
    probe = ("import importlib.metadata as m, mcp, pydantic_settings, langchain_mcp_adapters.client, envace_mcp;"
             "print(m.version('mcp'), mcp.__file__, envace_mcp.__file__)")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs, mcp_file, envace_file = done.stdout.split()
    assert theirs.startswith("1.") and mcp_file.startswith(str(venv))
    assert not envace_file.startswith(str(venv))  # envace-mcp is this environment's, not a copy
    assert here.startswith("2.") and version("mcp") == here


def test_langchain_mcp_adapters_tools_are_gated_alike_in_an_environment_of_their_own():
    python = adapters_venv() / "bin" / "python"
    done = subprocess.run([str(python), __file__, sys.executable], cwd=Path(__file__).parent,
                          capture_output=True, text=True, timeout=240, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["mcp"].startswith("1.")  # the adapters' mcp, not this environment's
    import anyio

    schemas = anyio.run(listed_schemas)
    for form in ("middleware", "tool_node"):
        for answer in ANSWERS:
            facts = report[form][answer]
            assert_gated(facts, answer, server="langchain")  # the adapters keep no server name
            assert {name: s["input_schema"] for name, s in facts["specs"].items()} == schemas


@pytest.mark.slow
def test_the_examples_run_as_written_and_approve_the_delete_after_showing_it():
    """Both examples, with the embedded model rehearsing: the langchain.mcp one here, the adapters' one by the
    last command of its docstring, in the environment its other commands made."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    runs = [subprocess.run([sys.executable, str(ROOT / "examples" / "langchain_mcp_agent.py")], cwd=ROOT,
                           capture_output=True, text=True, timeout=600, env=env, stdin=subprocess.DEVNULL),
            run_as_documented(recipe()[-1], adapters_venv(), timeout=600, env=env)]
    for done in runs:
        assert done.returncode == 0, done.stderr[-4000:]
        assert "approval requested:\ndelete_todo({\"id\": \"t2\"})" in done.stdout
        assert "delete_todo: decision=ask approved=True ran=True" in done.stdout
        assert "list_todos: decision=execute approved=None ran=True" in done.stdout


async def _adapters_report(server_python: str) -> dict[str, Any]:
    """In the adapters' environment: each drop-in and answer on the to-do server over stdio, one persistent
    session (and server process) per run, so the delete's effect is read back from the same server."""
    from importlib.metadata import version

    from langchain_mcp_adapters.client import MultiServerMCPClient
    from langchain_mcp_adapters.tools import load_mcp_tools

    client = MultiServerMCPClient({"todo": {"transport": "stdio", "command": server_python,
                                            "args": [str(TODO_SERVER)]}})
    report: dict[str, Any] = {"mcp": version("mcp")}
    for form in ("middleware", "tool_node"):
        for answer in ANSWERS:
            async with client.session("todo") as session:
                async def todo_ids() -> list[str]:
                    listed = await session.call_tool("list_todos", {})
                    return [t["id"] for t in listed.structuredContent["todos"]]

                tools = await load_mcp_tools(session, server_name="todo")
                report.setdefault(form, {})[answer] = await gated_delete(tools, todo_ids, answer, form)
    return report


if __name__ == "__main__":
    import asyncio

    print(json.dumps(asyncio.run(_adapters_report(sys.argv[1]))))
