"""Probes: a reference run's prefix, then one perturbed call, answered by the real server.

Reference runs teach the world model what *right* calls return; an agent's own calls are mostly
wrong ones (a digit dropped from an id, an amount over the balance, a market order while the
market is closed), and a world model that never saw an error predicts success for them, so the
gate lets them through. A probe takes a reference call and changes one argument, the ways agents get
them wrong, keeping only changes the tool's input schema accepts (the schema check already stops the
rest without a model):

- `drop_digit` / `digit`: an id with one digit dropped or changed (`CHK-995` for `CHK-9995`): an
  order, account or gift card that does not exist;
- `swap`: an id replaced by another id of the same kind seen in the conversation (another account,
  another of the customer's orders, an item of another order);
- `scale`: a number × 100 (an amount over the balance, a quantity over the position);
- `halve`: a number halved (usually still legal: a *right* call whose reply the world model must
  compute, a new balance or total, rather than copy; balances the errors above);
- `enum`: another value of an enumerated argument (`market` for `limit`, `sell` for `buy`).

Ids in a list (retail's `item_ids`) are changed one element at a time (field `item_ids[0]`).

The changed call really runs, on the suite's in-process server in the state the prefix reached,
and its real reply (error or not: some changes are legal) is the rehearse target SFT learns
(`train.sft.sft_rows`). A probe run carries no task reward, so SFT takes none of its act turns,
and keeps only the probe's rehearse step (the prefix's rehearsals are the reference run's rows).

Evaluation only ever probes a suite's own sandbox server; never a user's real one.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace_mcp.errors import UserError
from envace_mcp.envs import Action, Task

ID = re.compile(r"(?<![\w#])(#?[A-Z]{1,6}-?|[a-z]+(?:_[a-z]+)*_)(\d{2,})\b")
"""Id-like strings: a prefix and digits. Capital prefixes with or without a hyphen or a `#` (`CHK-9995`,
`ORD-17`, retail's `#W4527346`, `I-13888`) and snake-case ones (`gift_card_3561`, `ana_silva_2675`)."""
FAMILY = {"drop_digit": "typo", "digit": "typo"}
"""Mutations of one family (an id mistyped one way or another) count as one kind when probes are
picked: each family once, in a random order, before any family twice."""
KINDS = ("typo", "drop_digit", "digit", "swap", "scale", "halve", "enum")
"""What `kinds` may name: a family or a single mutation."""


def check_kinds(kinds: Collection[str] | None) -> frozenset[str] | None:
    """`kinds` as a set (None: every kind), or a `UserError` naming the unknown ones (an empty
    selection too): a misspelt kind would otherwise silently keep no probes."""
    if kinds is None:
        return None
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise UserError(f"unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(KINDS)}")
    return frozenset(kinds)
NO_ANSWER = "I could not complete that request."
"""A probe run's final answer: never trained on (a probe has no task reward)."""


@dataclass(frozen=True)
class Probe:
    """One perturbed call: the task's reference actions before `at`, then `call`."""

    task_id: str
    at: int
    mutation: str
    field: str
    call: Action

    def to_dict(self) -> dict[str, Any]:
        return {"of": self.task_id, "at": self.at, "mutation": self.mutation, "field": self.field,
                "tool": self.call.tool, "arguments": self.call.arguments}


def _argument_schema(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """An argument's own schema, with a single non-null branch of `anyOf` taken (pydantic's optionals)."""
    prop = dict(((schema or {}).get("properties") or {}).get(name) or {})
    options = [o for o in prop.get("anyOf", []) if isinstance(o, dict) and o.get("type") != "null"]
    return options[0] if len(options) == 1 else prop


def mutations(arguments: dict[str, Any], schema: dict[str, Any], seen: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every one-argument change of `arguments` this module knows: `(mutation, field, new arguments)`.
    `seen` is the conversation's text so far, where `swap` finds other ids. Not yet checked against
    the schema (`task_probes` does)."""
    for name, value in arguments.items():
        prop = _argument_schema(schema, name)
        changed: list[tuple[str, Any]] = []
        if isinstance(value, str):
            changed += _id_changes(value, seen)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, str):
                    for mutation, new in _id_changes(item, seen):
                        yield mutation, f"{name}[{i}]", {**arguments, name: [*value[:i], new, *value[i + 1:]]}
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            changed.append(("scale", value * 100))
            half = value // 2 if isinstance(value, int) else round(value / 2, 2)
            if 0 < half != value:
                changed.append(("halve", half))
        for option in prop.get("enum") or []:
            if option != value:
                changed.append(("enum", option))
        for mutation, new in changed:
            yield mutation, name, {**arguments, name: new}


def _id_changes(value: str, seen: str) -> list[tuple[str, str]]:
    """The id in `value` mistyped (a digit dropped, the last one changed) and swapped for each other id
    of its kind in `seen`; nothing when `value` holds no id."""
    match = ID.search(value)
    if not match:
        return []
    prefix, digits = match.groups()
    start, end = match.span(2)
    last = str((int(digits[-1]) + 1) % 10)
    changed = [("drop_digit", value[:start] + digits[:-1] + value[end:]),
               ("digit", value[:start] + digits[:-1] + last + value[end:])]
    others = sorted({m.group(0) for m in ID.finditer(seen) if m.group(1) == prefix} - {match.group(0)})
    return changed + [("swap", value[:match.start()] + other + value[match.end():]) for other in others]


def task_probes(task: Task, results: list[Any], schemas: dict[str, dict[str, Any]], valid: Callable[[str, dict[str, Any]], bool],
                *, per_call: int, rng: random.Random, kinds: Collection[str] | None = None) -> list[Probe]:
    """Up to `per_call` probes of each reference call of `task`, one of each mutation family (`FAMILY`)
    before any family twice. `results[i]` is what reference call `i` returned (the text `swap` looks for ids in, with the
    instruction); `valid(tool, arguments)` is the tool's input-schema check; `kinds` (families or
    mutations, `KINDS`) keeps only those, to balance errors against right calls (default: all)."""
    probes: list[Probe] = []
    seen = task.instruction
    for at, action in enumerate(task.actions):
        families: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
        for mutation, name, arguments in mutations(dict(action.arguments), schemas.get(action.tool, {}), seen):
            family = FAMILY.get(mutation, mutation)
            if (kinds is None or mutation in kinds or family in kinds) and valid(action.tool, arguments):
                families.setdefault(family, []).append((mutation, name, arguments))
        for options in families.values():
            rng.shuffle(options)
        order = list(families)
        rng.shuffle(order)
        picked = [families[f][i] for i in range(per_call) for f in order if i < len(families[f])][:per_call]
        probes += [Probe(task.id, at, mutation, name, Action(action.tool, arguments)) for mutation, name, arguments in picked]
        seen += f"\n{results[at]}"
    return probes


def schema_checks(toolbox: Any, server: str) -> tuple[dict[str, dict[str, Any]], Callable[[str, dict[str, Any]], bool]]:
    """`server`'s tools as `task_probes` takes them: each tool's input schema by its remote name, and
    `valid(tool, arguments)`, the tool's own input-schema check."""
    specs = {spec.remote_name: spec for spec in toolbox.catalog.for_server(server)}

    def valid(tool: str, arguments: dict[str, Any]) -> bool:
        return tool in specs and not specs[tool].validator.errors(arguments)

    return {name: spec.input_schema for name, spec in specs.items()}, valid


@dataclass
class ProbeSummary:
    """What `record_probe_traces` wrote, and, with `own_rehearsals`, how the world model did on it."""

    runs: int = 0
    real_errors: int = 0
    by_mutation: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per mutation: runs, real errors, and with own rehearsals `status_right` (error predicted exactly
    when the server erred, from a usable rehearsal)."""
    field_scores: list[float] = field(default_factory=list)
    status_right_on_errors: int = 0
    status_right_on_successes: int = 0

    def add(self, mutation: str, real_error: bool, comparison: Any = None) -> None:
        """One probe: whether the server erred, and with own rehearsals the rehearsal's `Comparison`
        with the real reply (its `status_match`: an error predicted exactly when the server erred, from
        a usable rehearsal)."""
        row = self.by_mutation.setdefault(mutation, {"runs": 0, "real_errors": 0, "status_right": 0})
        self.runs += 1
        row["runs"] += 1
        self.real_errors += real_error
        row["real_errors"] += real_error
        if comparison is None:
            return
        right = bool(comparison.status_match)
        row["status_right"] += right
        self.field_scores.append(comparison.score)
        if real_error:
            self.status_right_on_errors += right
        else:
            self.status_right_on_successes += right

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"runs": self.runs, "real_errors": self.real_errors, "by_mutation": self.by_mutation}
        if self.field_scores:
            successes = self.runs - self.real_errors
            out |= {"field_accuracy": round(sum(self.field_scores) / len(self.field_scores), 3),
                    "error_predicted": f"{self.status_right_on_errors}/{self.real_errors}",
                    "success_predicted": f"{self.status_right_on_successes}/{successes}",
                    "status_accuracy": round((self.status_right_on_errors + self.status_right_on_successes)
                                             / max(self.runs, 1), 3)}
        return out


async def record_probe_traces(model: Any, suite_name: str, out: str | Path, *, split: str = "train",
                              limit: int | None = None, per_call: int = 2, seed: int = 0, kinds: Collection[str] | None = None,
                              own_rehearsals: bool = False, sampling: dict[str, Any] | None = None,
                              on_task: Callable[[str, int], None] | None = None) -> ProbeSummary:
    """Record up to `per_call` probes of every reference call of the split's tasks (the first `limit`)
    as traces in `out`, with `model`'s token ids (no logprobs). `own_rehearsals`: `model` rehearses each
    probed call itself (greedy unless `sampling` says otherwise) and the trace compares it with the
    real reply: the world model on calls it was not trained on, errors reported apart."""
    from envace_mcp.envs import get_suite, require_sandbox
    from envace_mcp.envs.reference import calls_made, reference_roles
    from envace_mcp.graph import create_envace_graph
    from envace_mcp.policy.forced import ForcedPolicy
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.traces import TraceStore
    from envace_mcp.train.forced_runs import EVERY_CALL_RUNS, forced_run

    kinds = check_kinds(kinds)
    suite = require_sandbox(get_suite(suite_name))
    tasks = suite.split(split)[:limit] if limit else suite.split(split)
    store = TraceStore(out)
    graph = create_envace_graph().compile()
    rehearse_format = getattr(model, "rehearse_format", "simulator")
    summary = ProbeSummary()
    async with Toolbox({suite_name: suite.build_server()}) as toolbox:
        schemas, valid = schema_checks(toolbox, suite_name)
        for task in tasks:
            actions = list(task.actions)
            results = [suite.reference_result(task, actions[:i], a.tool, dict(a.arguments)) for i, a in enumerate(actions)]
            probes = task_probes(task, results, schemas, valid, per_call=per_call,
                                 rng=random.Random(f"{seed}:{task.id}"), kinds=kinds)
            for probe in probes:
                roles = reference_roles(suite, task, answer=NO_ANSWER, actions=[*actions[:probe.at], probe.call],
                                        rehearse_format=rehearse_format)
                if own_rehearsals:  # the model rehearses the probed call; the prefix stays forced
                    forced = roles["rehearse"]
                    roles["rehearse"] = lambda request, forced=forced, at=probe.at: (
                        None if calls_made(request.history) == at else forced(request))
                _, _, trace = await forced_run(graph, toolbox, suite, task, ForcedPolicy(model, **roles, score=False),
                                               EVERY_CALL_RUNS, sampling, group_id=f"{task.id}/probe")
                trace = _keep_probe_rehearsal(trace, probe)
                store.append(trace)
                tool = next((s for s in trace.steps if s.role == "tool" and s.call_id == trace.metadata["probe"]["call_id"]), None)
                summary.add(probe.mutation, bool(tool is not None and (tool.result or {}).get("is_error")),
                            tool.comparison if own_rehearsals and tool is not None else None)
            if on_task is not None:
                on_task(task.id, len(probes))
    return summary


def _keep_probe_rehearsal(trace: Any, probe: Probe) -> Any:
    """The trace with only the probed call's rehearse step (the prefix's rehearsals are the reference
    run's own SFT rows), and the probe in `metadata["probe"]`."""
    calls = [s.call_id for s in trace.steps if s.role == "tool"]
    call_id = calls[probe.at] if len(calls) > probe.at else None
    trace = copy.copy(trace)
    trace.steps = [s for s in trace.steps if s.role != "rehearse" or s.call_id == call_id]
    trace.metadata = {**trace.metadata, "probe": probe.to_dict() | {"call_id": call_id}}
    return trace
