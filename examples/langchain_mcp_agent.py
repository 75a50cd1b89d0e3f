"""`langchain.mcp` tools behind `RehearsalMiddleware` (needs `pip install "envace-mcp[langchain-mcp]"`).

LangChain's `MCPAdapter` makes the to-do server's tools (examples/todo_server.py, over stdio) into LangChain
tools; the middleware reads each one's hints from where the adapter keeps them (`tool.metadata["mcp"]`), so
`list_todos` (read-only) runs unasked and `delete_todo` (destructive) pauses the agent until a person
answers, shown the call and its rehearsed outcome. (The embedded world model knows the bundled servers,
not this one: its rehearsal may be unreadable, which the request says; `world_model=` takes one fitted to
your tools.)

    python examples/langchain_mcp_agent.py
"""

import warnings
from pathlib import Path
from typing import Any

import anyio
from langchain.agents import create_agent
from langchain_core._api import LangChainBetaWarning
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from envace_mcp.graph.middleware import RehearsalMiddleware
from envace_mcp.policy import SamplingParams, load_policy

warnings.filterwarnings("ignore", category=LangChainBetaWarning)  # langchain.mcp says it is in beta
from langchain.mcp import MCPAdapter  # noqa: E402

SERVER = Path(__file__).with_name("todo_server.py")


class ScriptedChatModel(GenericFakeChatModel):
    """Stands in for your chat model (ChatOpenAI, ChatOllama, …) so the example is deterministic."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedChatModel":
        return self


async def main() -> None:
    model = ScriptedChatModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "list_todos", "args": {}, "id": "c1"},
                                          {"name": "delete_todo", "args": {"id": "t2"}, "id": "c2"}]),
        AIMessage(content="Deleted 'Buy milk'."),
    ]))
    policy = load_policy(role_sampling={"rehearse": SamplingParams(max_new_tokens=48, temperature=0)})
    async with MCPAdapter(SERVER) as adapter:  # one session for the whole run
        tools = await adapter.list_tools()
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
    anyio.run(main)
