"""Graph overhead per tool step: the EnvACE graph vs a plain LangGraph agent with `ToolNode`.

Both run the same scripted turns (K `get_balance` calls, one per turn, then an answer) against the
same in-process bank server through the same toolbox, so the difference is what the graphs add: the
EnvACE graph's rehearse/gate bookkeeping, rehearsal records and memory vs a bare agent ⇄ ToolNode loop
(read-only calls are not rehearsed by default, so no model time is involved in either).
Runs alternate between the two graphs so drift hits both alike.

    python benchmarks/graph_overhead.py [--steps 8] [--runs 30] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Annotated, Any, TypedDict

import anyio
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from envace_mcp.envs import get_suite
from envace_mcp.graph import EnvaceContext, GateConfig, RunLimits, create_envace_graph
from envace_mcp.policy.prompts import tool_call_text
from envace_mcp.testing import ScriptedPolicy
from envace_mcp.toolbox import Toolbox


class PlainState(TypedDict):
    messages: Annotated[list, add_messages]


def plain_agent(tools: list[Any], steps: int, account: str) -> Any:
    def agent(state: PlainState) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
        if done < steps:
            return {"messages": [AIMessage(content="", tool_calls=[
                {"name": "get_balance", "args": {"account_id": account}, "id": f"c{done}", "type": "tool_call"}])]}
        return {"messages": [AIMessage(content="done")]}

    builder = StateGraph(PlainState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return builder.compile()


async def main(steps: int, runs: int, rounds: int) -> None:
    suite = get_suite("bank")
    account = next(iter(suite.build_server().episodes.state("default")["accounts"]))
    envace = create_envace_graph().compile()
    script = [tool_call_text("get_balance", {"account_id": account})] * steps + ["done"]
    envace_times: list[float] = []
    plain_times: list[float] = []
    async with Toolbox({"bank": suite.build_server()}) as toolbox:
        plain = plain_agent(toolbox.langchain_tools(), steps, account)

        async def run_envace() -> None:
            context = EnvaceContext(policy=ScriptedPolicy(act=script), toolbox=toolbox, gate=GateConfig(require_approval="never"),
                                    limits=RunLimits(max_steps=steps + 2))
            out = await envace.ainvoke({"messages": [HumanMessage(content="balances")]}, context=context)
            assert out["final_answer"] == "done" and out["real_calls"] == steps, out.get("status")

        async def run_plain() -> None:
            out = await plain.ainvoke({"messages": [HumanMessage(content="balances")]}, {"recursion_limit": 4 * steps + 10})
            assert out["messages"][-1].content == "done"

        for _ in range(3):  # warm
            await run_envace()
            await run_plain()
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(runs):
                await run_envace()
            envace_times.append((time.perf_counter() - start) / (runs * steps))
            start = time.perf_counter()
            for _ in range(runs):
                await run_plain()
            plain_times.append((time.perf_counter() - start) / (runs * steps))
    e, p = statistics.median(envace_times) * 1e3, statistics.median(plain_times) * 1e3
    print(f"in-process bank server, {steps} get_balance steps per run, {runs} runs x {rounds} rounds (median)")
    print(f"  LangGraph agent + ToolNode : {p:7.3f} ms per tool step")
    print(f"  EnvACE graph               : {e:7.3f} ms per tool step")
    print(f"  ratio EnvACE / ToolNode    : {e / p:7.3f}x  (goal <= 1.5x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args()
    anyio.run(main, ns.steps, ns.runs, ns.rounds)
