"""Test-time rehearsal (the paper's TTS): imagine N full runs, critique them, then act once for real.

    final, attempts = await rehearse_then_act(create_envace_graph(), task, context, n=2, strategy="parallel")

- parallel: N independent imagined runs (simulated mode: every call answered by the rehearse role),
  each followed by a self-critique;
- sequential: each imagined run sees the earlier attempts and critiques in its memory.
The attempts are condensed into notes (the calls tried, whether each simulated tool answered ok, with
an error, or was refused by the gate, the verdict, pitfalls and advice; never a simulated value or an
imagined answer) that condition the one committed real run, through the act role's
"# Rehearsal memory" section. N = 2 by default (the paper's best; N = 3 was slightly worse).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import StateGraph

from envace_mcp.graph.state import EnvaceContext
from envace_mcp.policy.prompts import NOT_EXECUTED
from envace_mcp.policy.types import Critique, CritiqueRequest


@dataclass
class Attempt:
    """One imagined run and its critique."""

    index: int
    state: dict[str, Any]
    critique: Critique

    def path(self) -> list[str]:
        """The calls the attempt made, each with how its simulated tool answered: ok, the error's text
        (a predicted failure is what rehearsal is for), or the gate's refusal without its rehearsed outcome.

        A simulated tool's values are the world model's guesses; they stay out of the memory (with the
        imagined final answer), because a committed run copies them into its answer as if they were
        facts (an imagined balance quoted over the real one)."""
        replies = {m.tool_call_id: m for m in self.state.get("messages", []) if isinstance(m, ToolMessage)}
        lines = []
        for message in self.state.get("messages", []):
            if not isinstance(message, AIMessage):
                continue
            for call in message.tool_calls:
                text = f"{call['name']}({json.dumps(call['args'], ensure_ascii=False)[:120]})"
                answer = replies.get(call.get("id"))
                if answer is not None and answer.additional_kwargs.get(NOT_EXECUTED):
                    # the gate's refusal, without the rehearsed outcome it quotes (a guess, too)
                    text += f" -> {str(answer.content).split(' Rehearsed outcome:')[0][:160]}"
                elif answer is not None and answer.status == "error":
                    text += f" -> simulated error: {str(answer.content)[:160]}"
                elif answer is not None:
                    text += " -> simulated ok"
                lines.append(text)
        return lines

    def summary(self, same_as: int | None = None) -> str:
        verdict = {True: "success", False: "failure", None: "no verdict"}[self.critique.success]
        lines = [f"Attempt {self.index} ({verdict}):"]
        if same_as is not None:
            lines.append(f"  the same calls as attempt {same_as}")
        else:
            lines += [f"  {c}" for c in self.path()] or ["  no tool calls"]
        if self.critique.pitfalls:
            lines.append(f"  pitfalls: {self.critique.pitfalls[:300]}")
        if self.critique.advice:
            lines.append(f"  advice: {self.critique.advice[:300]}")
        return "\n".join(lines)


HEADING = ("Before acting you rehearsed this task {n} time(s) against simulated tools. "
           "Their results were guesses, so none are shown: take every value from the real tools.")
"""The memory's first line (`n`: how many attempts)."""


def condense(attempts: list[Attempt]) -> str:
    """The rehearsal memory handed to the committed run: each attempt's path (`Attempt.path`), its
    verdict, pitfalls and advice; an attempt with the same calls as an earlier one says so instead. No
    simulated value and no imagined answer: those are guesses, and the real tools are about to answer."""
    if not attempts:
        return ""
    head = HEADING.format(n=len(attempts))
    seen: dict[tuple[str, ...], int] = {}
    parts = [head]
    for attempt in attempts:
        path = tuple(attempt.path())
        parts.append(attempt.summary(same_as=seen.get(path) if path else None))
        seen.setdefault(path, attempt.index)
    return "\n".join(parts)


async def _imagine(compiled: Any, task: str, context: EnvaceContext, index: int, earlier: list[Attempt]) -> Attempt:
    simulated = dataclasses.replace(context, mode="simulated")
    state = await compiled.ainvoke({"messages": [HumanMessage(content=task)], "notes": condense(earlier)},
                                   context=simulated)
    request = CritiqueRequest(task=task, transcript=list(state["messages"]),
                              earlier=[a.critique.text for a in earlier])
    critique = await context.policy.critique(request, context.sampling.get("critique"))
    return Attempt(index=index, state=state, critique=critique.parsed)


async def imagine(
    graph: StateGraph | Any,
    task: str,
    context: EnvaceContext,
    *,
    n: int = 2,
    strategy: Literal["parallel", "sequential"] = "parallel",
) -> list[Attempt]:
    """`n` imagined runs (simulated mode), each with its critique."""
    # imagined runs are throwaway: never written to the caller's checkpointer or thread
    compiled = graph.compile() if isinstance(graph, StateGraph) else graph.builder.compile()
    if strategy == "parallel":
        return list(await asyncio.gather(*(_imagine(compiled, task, context, i + 1, []) for i in range(n))))
    attempts: list[Attempt] = []
    for i in range(n):
        attempts.append(await _imagine(compiled, task, context, i + 1, attempts))
    return attempts


async def rehearse_then_act(
    graph: StateGraph | Any,
    task: str,
    context: EnvaceContext,
    *,
    n: int = 2,
    strategy: Literal["parallel", "sequential"] = "parallel",
    config: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[Attempt]]:
    """Run `n` imagined attempts, then one real run conditioned on them. Returns (final state, attempts)."""
    attempts = await imagine(graph, task, context, n=n, strategy=strategy)
    compiled = graph.compile() if isinstance(graph, StateGraph) else graph
    final = await compiled.ainvoke({"messages": [HumanMessage(content=task)], "notes": condense(attempts)},
                                   config or {}, context=context)
    return final, attempts
