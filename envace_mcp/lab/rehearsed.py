"""Reference runs recorded under a test-time rehearsal memory: SFT rows for an act role that will see one.

Test-time rehearsal (`graph.tts`) hands the committed run a "# Rehearsal memory" before its first call:
the paths of N imagined attempts. Reference runs never have one (the in-run memory appears only after a
call was rehearsed), so a model trained on them alone meets the memory first at test time, a shift of
its prompt that can cost more than the memory gives (docs/evidence.md#test-time-rehearsal). These runs
put the memory there in training.

Each imagined attempt is one of the ways the model's own imagined runs go (seeded per task):

- `right`: the reference calls;
- `mistyped`: a reference call made first with a mistyped or swapped id (`probes.task_probes`) that the
  domain rejects, then, half the time, the rest of the reference calls (the attempt recovered);
- `short`: the reference calls cut short;
- `trap`: the reference calls, then the careless write a task that must be refused or fail tempts
  (`Task.trap`: a limit order for a market order while the market is closed), which the domain
  usually accepts.

Each path runs through the real graph in simulated mode, answered by a perfect simulator (the domain's
own functions), with the gate as given, and is condensed by `graph.tts.condense`: the committed run sees
exactly what test-time rehearsal would show it (a simulated error, the gate's refusal), with no
critique (the embedded model gives none). The committed run is the reference run, with that memory:
whatever the attempts did, the right calls are the target. A task with no reference call (a request to
refuse) gets `right` attempts, with no calls.
"""

from __future__ import annotations

import random
from typing import Any

from langchain_core.messages import HumanMessage

from envace_mcp.envs import Action, Task

KINDS = ("right", "mistyped", "short", "trap")
WEIGHTS = (0.35, 0.3, 0.2, 0.15)
"""How often each kind is drawn: wrong and cut-short runs are most of what a small model imagines,
right ones show the memory can be followed."""


def imagined_paths(task: Task, suite: Any, schemas: dict[str, dict[str, Any]], valid: Any, *, n: int,
                   rng: random.Random) -> list[tuple[str, list[Action]]]:
    """`n` imagined attempts at `task`: (kind, calls), drawn by `WEIGHTS`; a kind the task cannot
    give (no mutation the domain rejects, one call to cut short, no trap) falls back to `right`."""
    from envace_mcp.lab.probes import task_probes

    actions = list(task.actions)
    results = [suite.reference_result(task, actions[:i], a.tool, dict(a.arguments)) for i, a in enumerate(actions)]
    probes = [p for p in task_probes(task, results, schemas, valid, per_call=2, rng=rng, kinds=("typo", "swap"))
              if _is_error(suite.reference_result(task, actions[:p.at], p.call.tool, dict(p.call.arguments)))]
    paths: list[tuple[str, list[Action]]] = []
    for _ in range(n):
        kind = rng.choices(KINDS, WEIGHTS)[0]
        if kind == "mistyped" and probes:
            probe = rng.choice(probes)
            rest = actions[probe.at:] if rng.random() < 0.5 else []
            paths.append((kind, [*actions[:probe.at], probe.call, *rest]))
        elif kind == "short" and len(actions) >= 2:
            paths.append((kind, actions[:rng.randrange(1, len(actions))]))
        elif kind == "trap" and task.trap is not None:
            paths.append((kind, [*actions, task.trap]))
        else:
            paths.append(("right", actions))
    return paths


def _is_error(result: Any) -> bool:
    return isinstance(result, dict) and "error_tool_call" in result


async def imagined_notes(graph: Any, toolbox: Any, suite: Any, task: Task, model: Any, gate: Any,
                         paths: list[tuple[str, list[Action]]]) -> str:
    """The rehearsal memory test-time rehearsal would hand the committed run after `paths`: each path
    run in simulated mode (a perfect simulator answers; the gate decides as it would), condensed."""
    from envace_mcp.envs.reference import reference_roles
    from envace_mcp.graph import EnvaceContext
    from envace_mcp.graph.tts import Attempt, condense
    from envace_mcp.policy.forced import ForcedPolicy
    from envace_mcp.policy.types import Critique

    attempts = []
    for index, (_, calls) in enumerate(paths, start=1):
        roles = reference_roles(suite, task, actions=calls, rehearse_format=getattr(model, "rehearse_format", "simulator"))
        context = EnvaceContext(policy=ForcedPolicy(model, **roles, score=False), toolbox=toolbox, gate=gate,
                                mode="simulated", instructions=suite.server_module.POLICY)
        state = await graph.ainvoke({"messages": [HumanMessage(content=task.instruction)]}, context=context)
        attempts.append(Attempt(index=index, state=state, critique=Critique()))
    return condense(attempts)

