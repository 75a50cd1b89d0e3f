"""The environment's reward besides the checker's score: a run's tool calls against its task's reference.

FinMCP-Bench's metric: a made call counts once per matching reference call, by name and arguments;
precision, recall and F1 over the run, and whether the sequence matched exactly. `run_task` records the
F1 as the `call_f1` reward (GRPO shapes with it); evaluation reports the match.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from envace_mcp.envs.task import Task
from envace_mcp.traces.schema import STOPPED, Trace

Call = tuple[str, Any]
"""A tool call as (name, arguments)."""


def _key(call: Call) -> tuple[str, str]:
    name, arguments = call
    return name, json.dumps(arguments if arguments is not None else {}, sort_keys=True, ensure_ascii=False, default=str)


def call_match(made: Sequence[Call], reference: Sequence[Call]) -> dict[str, Any]:
    """Multiset match of made vs reference calls by (name, arguments); also by name alone."""
    made_keys, ref_keys = Counter(map(_key, made)), Counter(map(_key, reference))
    tp = sum((made_keys & ref_keys).values())
    tp_name = sum((Counter(n for n, _ in made) & Counter(n for n, _ in reference)).values())
    return {"made": len(made), "reference": len(reference), "tp": tp, "tp_name": tp_name,
            "exact": [_key(c) for c in made] == [_key(c) for c in reference]}


def made_calls(trace: Trace) -> list[Call]:
    """The calls a run made: those that ran (approved asks too) or were answered by a rehearsal, not those
    the gate or a human stopped; in single-turn suites (BFCL AST), where nothing executes, the calls the
    model proposed."""
    made = [(s.tool, s.arguments or {}) for s in trace.steps
            if s.role == "tool" and s.decision not in STOPPED and s.tool]
    if not any(s.role == "tool" for s in trace.steps):
        for step in trace.steps:
            if step.role == "act" and isinstance(step.parsed, dict):
                made += [(c.get("name"), c.get("arguments") or {}) for c in step.parsed.get("tool_calls") or []]
    return made


def reference_calls(task: Task) -> list[Call]:
    """The calls a task's reference run makes (its `actions`)."""
    return [(a.tool, dict(a.arguments)) for a in task.actions]


def call_f1(trace: Trace, task: Task) -> tuple[float, dict[str, Any]]:
    """A run's tool-call F1 against its task's reference calls, and the match it comes from (`call_match`)."""
    match = call_match(made_calls(trace), reference_calls(task))
    return prf(match["tp"], match["made"], match["reference"])["f1"], match


def prf(tp: int, made: int, reference: int) -> dict[str, float]:
    """Precision, recall, F1; an agent that makes no call on a task with none is perfect there."""
    precision = tp / made if made else (1.0 if reference == 0 else 0.0)
    recall = tp / reference if reference else (1.0 if made == 0 else 0.0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}
