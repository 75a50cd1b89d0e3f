"""langchain-mcp-adapters tools behind `RehearsalMiddleware`.

`MultiServerMCPClient` makes the to-do server's tools (examples/todo_server.py, over stdio) into LangChain
tools whose `metadata` holds the server's hints (`readOnlyHint`, ...); the middleware reads them, so
`list_todos` runs unasked and `delete_todo` pauses the agent until a person answers, shown the call and
its rehearsed outcome.

langchain-mcp-adapters 0.3.2 pins mcp<2 and envace-mcp needs mcp 2, so pip will not install them together:
give the adapters an environment of their own whose mcp 1.x comes before everything of envace-mcp's
(tests/graph/test_langchain_mcp_tools.py builds the same one). The server runs under envace-mcp's python.

    python -m venv --without-pip /tmp/lma
    python -m pip --python /tmp/lma/bin/python install --no-deps langchain-mcp-adapters==0.3.2 "mcp<2" httpx-sse
    python -c "import sysconfig; print(f'import site; site.addsitedir({sysconfig.get_paths()[\"purelib\"]!r})')" \
        > "$(/tmp/lma/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/envace.pth"
    /tmp/lma/bin/python examples/langchain_mcp_adapters_agent.py "$(python -c 'import sys; print(sys.executable)')"
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
