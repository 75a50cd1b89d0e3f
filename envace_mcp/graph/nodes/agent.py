"""agent: the act role proposes tool calls or gives the final answer; or the run ends without one, saying
why (`stop_reason`): its turns are spent, or the same call keeps being stopped (`nodes._stalls`)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.runtime import Runtime

from envace_mcp.graph.calls import call_ids, unique_ids
from envace_mcp.graph.nodes._common import act_request, emit
from envace_mcp.graph.nodes._stalls import stall
from envace_mcp.graph.state import EnvaceContext, EnvaceState
from envace_mcp.policy.chat_text import FORMAT_REMINDER
from envace_mcp.policy.prompts import GRAPH_NOTE



async def agent(state: EnvaceState, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    ctx = await runtime.context.prepare()
    stalled = stall(state["messages"], {r["call_id"]: r.get("reason") for r in state.get("rehearsals", [])})
    if stalled is not None:
        return {"status": "stalled", "final_answer": None, "stop_reason": str(stalled)}
    turns = ctx.limits.max_steps
    if state.get("steps", 0) >= turns:
        return {"status": "max_steps", "final_answer": None,
                "stop_reason": f"stopped: the agent spent its {turns} turn{'s' if turns != 1 else ''} (max_steps) "
                               "without answering"}
    request = act_request(state, ctx)
    generation = await ctx.policy.act(request, ctx.sampling.get("act"))
    emit(runtime, "agent", generation)
    parsed = generation.parsed
    calls = unique_ids([c.as_langchain() for c in parsed.tool_calls], call_ids(state["messages"]))
    text = parsed.reply_text(generation.text)
    message = AIMessage(content=text, tool_calls=calls)
    update: dict[str, Any] = {"messages": [message], "steps": 1, "status": "running"}
    if state.get("stop_reason"):  # an earlier request's, on a thread the user went on with
        update["stop_reason"] = None
    if calls:
        return update
    if parsed.malformed:  # a broken call is not an answer: say what was wrong and let it try again
        problems = "; ".join(i.message for i in parsed.issues if i.code == "invalid_tool_call")
        update["messages"].append(HumanMessage(content=FORMAT_REMINDER.format(problems=problems),
                                                  additional_kwargs={GRAPH_NOTE: "format"}))
        return update
    return {**update, "final_answer": text, "status": "finished"}

