"""The EnvACE graph on a bundled task: rehearse → gate → act, over stdio, with the embedded model.

    python examples/envace_graph.py [--model Qwen/Qwen3-1.7B] [--task bank/test/0010] [--rehearse 2]
"""

import argparse
import sys

import anyio
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from envace_mcp import Toolbox
from envace_mcp.envs import Episode, get_suite
from envace_mcp.graph import EnvaceContext, RunLimits, create_envace_graph
from envace_mcp.graph.tts import rehearse_then_act
from envace_mcp.policy import SamplingParams, load_policy


def review(request: dict) -> bool:
    """Your reviewer (a person, a UI, a rule), asked before each destructive call."""
    print("approval requested:\n" + request["description"])  # the call, every argument whole, and its rehearsal
    return True  # the bank server here is a sandbox, reset per episode


async def main(model: str | None, task_id: str, rehearse: int, max_new_tokens: int) -> None:
    suite = get_suite("bank")
    task = suite.task(task_id)
    policy = load_policy(model)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0)
    async with Toolbox({"mcpServers": {"bank": suite.stdio_config(sys.executable)}}) as toolbox:
        episode = Episode(task, "bank")
        context = EnvaceContext(policy=policy, toolbox=toolbox.scoped(episode.meta), limits=RunLimits(max_steps=3),
                                approve=review, instructions=suite.server_module.POLICY,
                                sampling={"act": sampling, "rehearse": sampling, "critique": sampling})
        graph = create_envace_graph()
        if rehearse:
            state, _ = await rehearse_then_act(graph, task.instruction, context, n=rehearse)
        else:
            compiled = graph.compile(checkpointer=InMemorySaver())  # yours to choose
            state = await compiled.ainvoke({"messages": [HumanMessage(content=task.instruction)]},
                                           {"configurable": {"thread_id": task.id}}, context=context)
        verdict = suite.check(task, await episode.final_state(toolbox), state.get("final_answer") or "")
    print(f"task: {task.instruction}")
    for record in state.get("rehearsals", []):
        print(f"  {record['tool']}: decision={record.get('decision')} match={record.get('match')}")
    print(f"answer: {state.get('final_answer')}\nchecker score: {verdict.score:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--task", default="bank/test/0000")
    parser.add_argument("--rehearse", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    ns = parser.parse_args()
    anyio.run(main, ns.model, ns.task, ns.rehearse, ns.max_new_tokens)
