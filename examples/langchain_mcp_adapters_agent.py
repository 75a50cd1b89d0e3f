"""langchain-mcp-adapters tools behind `RehearsalMiddleware`.

`MultiServerMCPClient` makes the to-do server's tools (examples/todo_server.py, over stdio) into LangChain
tools whose `metadata` holds the server's hints (`readOnlyHint`, ...); the middleware reads them, so
`list_todos` runs unasked and `delete_todo` pauses the agent until a person answers, shown the call and
its rehearsed outcome.

Two environments, because no released langchain-mcp-adapters runs on the mcp 2 that envace-mcp needs (checked
2026-12): 0.3.2, the newest, pins mcp<2, so `pip install langchain-mcp-adapters` into envace-mcp's environment
replaces its mcp 2 with 1.x; 0.3.1 and older allow mcp 2 but import mcp 1.x modules, so `pip install envace-mcp
langchain-mcp-adapters` picks 0.3.1 and it fails on import (`cannot import name 'RequestContext' from
'mcp.shared.context'`). For one environment, use LangChain's own MCP tools (examples/langchain_mcp_agent.py).

So the adapters get an environment of their own, /tmp/lma, that sees envace-mcp's environment after its own:
pip puts in it only what that one lacks or holds at another version (mcp 1.x, and what mcp 1.x needs beside
it: pydantic-settings, ...), and leaves envace-mcp's environment as it is; `--no-warn-conflicts` because
envace-mcp, seen from there, wants the mcp 2 it keeps at home. Run these from the repository's root with the
python of envace-mcp's environment (`pip install ".[langchain]"`), which also runs the to-do server:

    python -m venv --without-pip /tmp/lma
    python -c "import sysconfig; print(f'import site; site.addsitedir({sysconfig.get_paths()[\"purelib\"]!r})')" \
        > "$(/tmp/lma/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/envace.pth"
    python -m pip --python /tmp/lma/bin/python install --no-warn-conflicts langchain-mcp-adapters==0.3.2
    /tmp/lma/bin/python examples/langchain_mcp_adapters_agent.py "$(python -c 'import sys; print(sys.executable)')"

(tests/graph/test_langchain_mcp_tools.py runs these commands as they are written here.)
"""

import sys
from pathlib import Path
from typing import Any

import anyio
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from envace_mcp.graph.middleware import RehearsalMiddleware
from envace_mcp.policy import SamplingParams, load_policy

SERVER = Path(__file__).with_name("todo_server.py")


class ScriptedChatModel(GenericFakeChatModel):
    """Stands in for your chat model (ChatOpenAI, ChatOllama, …) so the example is deterministic."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedChatModel":
        return self


async def main(server_python: str) -> None:
    model = ScriptedChatModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "list_todos", "args": {}, "id": "c1"},
                                          {"name": "delete_todo", "args": {"id": "t2"}, "id": "c2"}]),
        AIMessage(content="Deleted 'Buy milk'."),
    ]))
    policy = load_policy(role_sampling={"rehearse": SamplingParams(max_new_tokens=48, temperature=0)})
    client = MultiServerMCPClient({"todo": {"transport": "stdio", "command": server_python, "args": [str(SERVER)]}})
    async with client.session("todo") as session:  # one session (one server process) for the whole run
        tools = await load_mcp_tools(session, server_name="todo")
        agent = create_agent(model, tools=tools, checkpointer=InMemorySaver(),
                             middleware=[RehearsalMiddleware(policy, tools=tools)])
        config = {"configurable": {"thread_id": "example"}}
        out = await agent.ainvoke({"messages": [HumanMessage(content="Delete the milk to-do.")]}, config)
        while out.get("__interrupt__"):
            answers = {}
            for pause in out["__interrupt__"]:
                print("approval requested:\n" + pause.value["description"])  # the call and its rehearsal, escaped
                answers[pause.id] = {"decisions": [{"type": "approve"}]}  # a person's answer, by interrupt id
            out = await agent.ainvoke(Command(resume=answers), config)
    for record in out["rehearsals"]:
        print(f"{record['tool']}: decision={record['decision']} approved={record.get('approved')} "
              f"ran={record.get('real') is not None}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "python")
