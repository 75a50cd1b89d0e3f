"""A run that cannot progress: the agent proposes, again and again, a call that is never run.

A model that made up an id proposes the same refused call turn after turn; each is rehearsed and
stopped, and the run spends its turns doing nothing (issue 51: ten times, then "final answer: None").
The rule, shared by the graph and the drop-ins, reads only the conversation (data any form has):

- a call (same tool, same arguments: `gate.call_key`) is counted each time its reply says it was not
  run (`NOT_EXECUTED`): the gate stopped it (`GATE_STOPS`) or its approval was refused (`rejected`: a
  person's no, or nobody there to ask), since the user's last message (the graph's own notes to the
  agent are not the user's);
- a gate stop that is its call's `REPEATED_STOPS`-th says so in its reason (`mark_repeats`), so the
  reply tells the agent this exact call will not run;
- once one call got there the run is stalled (`stall`): the graph and `RehearsalMiddleware` end it
  before another turn or rehearsal, with a reason a person reads (`Stall.__str__`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from envace_mcp.graph.calls import Proposal
from envace_mcp.graph.gate import Decision, call_key
from envace_mcp.policy.prompts import GRAPH_NOTE, NOT_EXECUTED

REPEATED_STOPS = 3
"""How many times one call (same tool, same arguments) may be stopped since the user's last message
before the run ends. Once may be a refusal the agent has not read yet and twice a retry it expected to
fare better; a third identical proposal is a loop, and every further turn costs a rehearsal and gets the
same answer."""

GATE_STOPS = frozenset({"reject", "feedback", "block", "budget"})
"""The gate's decisions that keep a call from running, as its reply marks them (`NOT_EXECUTED`)."""

_COUNTED = GATE_STOPS | {"rejected"}  # and a refused approval: asked three times, refused three times
_REPEATED = ". This exact call was stopped "


@dataclass(frozen=True)
class Stall:
    """A call stopped `times` times since the user's last message; `reason`: why, the last time;
    `by_gate`: whether the gate stopped it every time (rather than an approval being refused)."""

    tool: str
    arguments: Any
    times: int
    reason: str
    by_gate: bool = True

    def __str__(self) -> str:
        how = "the gate stopped it each time" if self.by_gate else "it was not run any of those times"
        return (f"stopped: the agent proposed {self.tool} {json.dumps(self.arguments, ensure_ascii=False)} "
                f"{self.times} times and {how}: {self.reason}")


def _stopped(messages: Sequence[Any]) -> dict[str, list[tuple[int, str, Any, ToolMessage]]]:
    """Per call key, the replies that say it was not run since the user's last message, each with its
    position, tool and arguments."""
    proposed: dict[str, tuple[str, Any]] = {}
    stopped: dict[str, list[tuple[int, str, Any, ToolMessage]]] = {}
    for i, message in enumerate(messages):
        if isinstance(message, HumanMessage) and not message.additional_kwargs.get(GRAPH_NOTE):
            stopped.clear()
        elif isinstance(message, AIMessage):
            proposed.update({c["id"]: (c["name"], c["args"]) for c in message.tool_calls if c.get("id")})
        elif (isinstance(message, ToolMessage) and message.additional_kwargs.get(NOT_EXECUTED) in _COUNTED
              and message.tool_call_id in proposed):
            name, arguments = proposed[message.tool_call_id]
            stopped.setdefault(call_key(name, arguments), []).append((i, name, arguments, message))
    return stopped


def mark_repeats(messages: Sequence[Any], decided: list[Proposal], limit: int = REPEATED_STOPS) -> list[Proposal]:
    """`decided` (gated proposals of one turn, answered by none of `messages` yet) with the reason of each
    gate stop that is its call's `limit`-th since the user's last message saying so, for the agent."""
    counts = {key: len(replies) for key, replies in _stopped(messages).items()}
    out = []
    for p in decided:
        if p.decision is not None and p.decision.action in GATE_STOPS:
            key = call_key(p.call.name, p.call.arguments)
            counts[key] = counts.get(key, 0) + 1
            if counts[key] >= limit:
                why = (f"{p.decision.reason}{_REPEATED}{counts[key]} times since the user's last message and will "
                       "not run: do not propose it again")
                p = replace(p, decision=Decision(p.decision.action, why))
        out.append(p)
    return out


def gate_reason(reason: str) -> str:
    """The gate's own reason, without the note `mark_repeats` added."""
    return reason.split(_REPEATED, 1)[0]


def stall(messages: Sequence[Any], reasons: Mapping[str, str | None] | None = None,
          limit: int = REPEATED_STOPS) -> Stall | None:
    """The call stopped `limit` times since the user's last message (of several, the one that got there
    last), or None. `reasons`: tool-call id -> the gate's reason (the graph's rehearsal records); without
    it, a reply's own record (`envace_rehearsal`, the drop-ins'), or its text."""
    found: list[tuple[int, str, Any, ToolMessage]] | None = None
    for replies in _stopped(messages).values():
        if len(replies) >= limit and (found is None or replies[-1][0] > found[-1][0]):
            found = replies
    if found is None:
        return None
    _, name, arguments, last = found[-1]
    by_gate = all(m.additional_kwargs.get(NOT_EXECUTED) in GATE_STOPS for *_, m in found)
    if last.additional_kwargs.get(NOT_EXECUTED) in GATE_STOPS:
        record = last.additional_kwargs.get("envace_rehearsal") or {}
        reason = gate_reason(str((reasons or {}).get(last.tool_call_id) or record.get("reason") or last.content))
    else:  # a refused approval: what the reply told the agent ("the call was not approved. Reason: ...")
        reason = str(last.content).removeprefix("Not executed: ")
    return Stall(tool=name, arguments=arguments, times=len(found), reason=reason, by_gate=by_gate)
