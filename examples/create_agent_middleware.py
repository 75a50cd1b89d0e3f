"""Drop-in for `langchain.agents.create_agent`: add `RehearsalMiddleware` (needs `langchain`).

A destructive call pauses the agent (LangGraph's `interrupt()`, in LangChain's approval shape) until
a person answers; compile with a checkpointer to resume. `approve=` (a callable) answers in the run.

    python examples/create_agent_middleware.py
"""

import sys
from typing import Any

import anyio
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from envace_mcp import Toolbox
from envace_mcp.envs import Episode, get_suite
from envace_mcp.graph.middleware import RehearsalMiddleware
from envace_mcp.policy import SamplingParams, load_policy


class ScriptedChatModel(GenericFakeChatModel):
    """Stands in for your chat model (ChatOpenAI, ChatOllama, …) so the example is deterministic."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedChatModel":
        return self


async def main() -> None:
    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "transfer_funds")
    transfer = next(a for a in task.actions if a.tool == "transfer")
    model = ScriptedChatModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "transfer", "args": transfer.arguments, "id": "c1"}]),
        AIMessage(content="Moved it."),
    ]))
    policy = load_policy(role_sampling={"rehearse": SamplingParams(max_new_tokens=48, temperature=0)})
    async with Toolbox({"mcpServers": {"bank": suite.stdio_config(sys.executable)}}) as toolbox:
        episode = Episode(task, "bank")
        tools = toolbox.langchain_tools(meta=episode.meta)
        agent = create_agent(model, tools=tools, checkpointer=InMemorySaver(),
                             middleware=[RehearsalMiddleware(policy, tools=tools)])
        config = {"configurable": {"thread_id": "example"}}
        out = await agent.ainvoke({"messages": [HumanMessage(content=task.instruction)]}, config)
        while out.get("__interrupt__"):  # each destructive call waits for approval (several may wait at once)
            answers = {}
            for pause in out["__interrupt__"]:
                print("approval requested:\n" + pause.value["description"])  # the call, whole, and its rehearsal
                answers[pause.id] = {"decisions": [{"type": "approve"}]}  # a person's answer, by interrupt id
            out = await agent.ainvoke(Command(resume=answers), config)
        verdict = suite.check(task, await episode.final_state(toolbox), out["messages"][-1].content)
    for message in out["messages"]:
        record = message.additional_kwargs.get("envace_rehearsal")
        if record:
            print(f"{record['tool']}: rehearsal={record['prediction'] and record['prediction']['status']} "
                  f"decision={record['decision']} match={record.get('match')}")
    print(f"checker score: {verdict.score:.2f}")


if __name__ == "__main__":
    anyio.run(main)
