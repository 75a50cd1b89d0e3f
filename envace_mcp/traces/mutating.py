"""Failures your agents happened not to make (`envace traces import --mutate`): a logged call with one
argument changed to a value its tool's input schema accepts, replayed after the episode's earlier calls,
the real replies recorded as a trace of its own. Only servers configured `"sandbox": true` are replayed
against; a call whose replay would reach any other server is left alone and counted.
"""

from __future__ import annotations

import json
import random
import string
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envace_mcp.errors import UserError
from envace_mcp.toolbox.catalog import ToolSpec
from envace_mcp.traces.schema import Step, Trace

if TYPE_CHECKING:
    from envace_mcp.toolbox import Toolbox

SEEN_SWAPS = 8
"""Other values of an argument seen in the log that a string may be changed to, at most (drawn by the seed):
a log with thousands of ids must not make one call's candidates thousands long."""
HUGE = 10**9
"""What an integer becomes as a "huge value": past any count, quantity or page a tool expects."""


@dataclass
class MutationSummary:
    """What `mutate_calls` did: variants replayed, and the calls it could not change, with why."""

    variants: int = 0
    errors: int = 0
    """Variants whose changed call failed for real."""
    diverged: int = 0
    """Variants whose replay of the earlier calls went otherwise than the log (an error where the log had
    none, or the other way): the sandbox's state is not the logged server's."""
    not_sandbox: int = 0
    """Calls left alone because they, or an earlier call of their episode, go to a server not marked sandbox."""
    servers: set[str] = field(default_factory=set)
    """Those servers."""
    missing: int = 0
    """Calls left alone because they, or an earlier call of their episode, name a tool the toolbox lacks."""
    unchangeable: int = 0
    """Calls without arguments, or with no one-argument change their tool's input schema accepts."""

    def report(self) -> list[str]:
        lines = [f"mutated {self.variants} call(s) and replayed each against its sandbox: {self.errors} of the "
                 "changed calls failed for real"]
        if self.not_sandbox:
            lines.append(f"{self.not_sandbox} call(s) not mutated: they or an earlier call of their episode go to "
                         f"servers not marked \"sandbox\": true ({', '.join(sorted(self.servers))})")
        if self.missing:
            lines.append(f"{self.missing} call(s) not mutated: they or an earlier call of their episode name a tool "
                         "the servers do not offer")
        if self.unchangeable:
            lines.append(f"{self.unchangeable} call(s) not mutated: no argument, or no change of one that their input "
                         "schema accepts")
        if self.diverged:
            lines.append(f"{self.diverged} replay(s) went otherwise than the log before the changed call (the "
                         "sandbox's state differs from the logged server's)")
        return lines


def _seen_values(traces: Iterable[Trace]) -> dict[str, list[str]]:
    """Every string each argument name took in the traces' calls, in order of first sight: the other ids
    and names an agent could have mixed up."""
    seen: dict[str, dict[str, None]] = {}
    for trace in traces:
        for step in trace.steps_of("tool"):
            for name, value in (step.arguments or {}).items() if isinstance(step.arguments, dict) else ():
                if isinstance(value, str):
                    seen.setdefault(name, {})[value] = None
    return {name: list(values) for name, values in seen.items()}


def _argument_schema(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """An argument's own schema, the one non-null branch of an `anyOf` taken (pydantic's optionals)."""
    prop = (schema.get("properties") or {}).get(name)
    prop = prop if isinstance(prop, dict) else {}
    options = [o for o in prop.get("anyOf") or [] if isinstance(o, dict) and o.get("type") != "null"]
    return options[0] if len(options) == 1 else prop


def _retyped(value: str, rng: random.Random) -> str:
    """`value` (not empty) with its last character changed to another of its kind (a digit, a letter of its
    case; anything else becomes a digit)."""
    last = value[-1]
    pool = next((p for p in (string.digits, string.ascii_lowercase, string.ascii_uppercase) if last in p), None)
    return value[:-1] + rng.choice([c for c in (pool or string.digits) if c != last])


def changes(arguments: dict[str, Any], spec: ToolSpec, seen: dict[str, list[str]],
            rng: random.Random) -> dict[str, list[Any]]:
    """Each argument's plausible wrong values that the tool's input schema accepts (the rest would only be
    refused, teaching nothing about the server): an enum's other members, a boolean flipped, an integer
    as 0, negative or huge, a string as another value the argument took in the log or with its last
    character changed. Arguments without one are left out."""
    found: dict[str, list[Any]] = {}
    for name, value in arguments.items():
        prop = _argument_schema(spec.input_schema, name)
        if isinstance(prop.get("enum"), list):
            options = [member for member in prop["enum"] if member != value]
        elif isinstance(value, bool):
            options = [not value]
        elif isinstance(value, int):
            options = [0, -abs(value) or -1, HUGE]
        elif isinstance(value, float):
            options = [0.0, -abs(value) or -1.0, float(HUGE)]
        elif isinstance(value, str):
            others = [v for v in seen.get(name, []) if v != value]
            options = rng.sample(others, min(len(others), SEEN_SWAPS)) + ([_retyped(value, rng)] if value else [])
        else:
            continue
        kept: list[Any] = []
        for option in options:  # enum members may be any JSON: compared, never hashed
            if option != value and option not in kept and not spec.validator.errors({**arguments, name: option}):
                kept.append(option)
        if kept:
            found[name] = kept
    return found


async def mutate_calls(traces: list[Trace], toolbox: Toolbox, *, per_episode: int,
                       seed: int = 0) -> tuple[list[Trace], MutationSummary]:
    """For up to `per_episode` calls of each trace (drawn by `seed`), a variant with one argument changed
    (`changes`), replayed on `toolbox` — the episode's earlier calls in order, then the changed call — and
    recorded with its real results as a new trace (`metadata`: `mutated_from`, `mutation`). Only calls whose
    whole replay goes to servers configured `"sandbox": true` are changed; the summary counts the rest."""
    if per_episode < 0:
        raise UserError(f"per_episode must be 0 or more, not {per_episode}")
    rng = random.Random(seed)
    seen = _seen_values(traces)
    summary = MutationSummary()
    variants: list[Trace] = []
    for trace in traces:
        calls = trace.steps_of("tool")
        options: dict[int, dict[str, list[Any]]] = {}
        for position, step in enumerate(calls):
            spec = toolbox.catalog.get(step.tool)
            if spec is None or not toolbox.specs[spec.server].sandbox:  # this call and every later one
                rest = len(calls) - position
                if spec is None:
                    summary.missing += rest
                else:
                    summary.not_sandbox += rest
                    summary.servers.add(spec.server)
                break
            found = changes(step.arguments if isinstance(step.arguments, dict) else {}, spec, seen, rng)
            if found:
                options[position] = found
            else:
                summary.unchangeable += 1
        for position in sorted(rng.sample(sorted(options), min(per_episode, len(options)))):
            name = rng.choice(sorted(options[position]))
            new = rng.choice(options[position][name])
            variant = await _replay(trace, calls[: position + 1], name, new, toolbox)
            summary.variants += 1
            summary.errors += bool(variant.steps[-1].result and variant.steps[-1].result["is_error"])
            summary.diverged += bool(variant.metadata["diverged"])
            variants.append(variant)
    return variants, summary


async def _replay(trace: Trace, calls: list[Step], name: str, new: Any, toolbox: Toolbox) -> Trace:
    started = time.time()
    target = calls[-1]
    old = target.arguments[name]
    steps: list[Step] = []
    diverged: list[int] = []
    for position, step in enumerate(calls):
        arguments = {**step.arguments, name: new} if step is target else step.arguments
        result = await toolbox.call(step.tool, arguments)
        if step is not target and result.is_error != bool((step.result or {}).get("is_error")):
            diverged.append(position)
        steps.append(Step(index=position, role="tool", call_id=step.call_id, time=time.time(), tool=step.tool,
                          arguments=arguments, result=result.model_dump(mode="json")))
    mutation = f"{name}: {json.dumps(old, ensure_ascii=False)} → {json.dumps(new, ensure_ascii=False)}"
    return Trace(run_id=uuid.uuid4().hex, task_id=trace.task_id, mode="real", task=trace.task,
                 tools=toolbox.catalog.to_dicts(), started_at=started, ended_at=time.time(), status="finished",
                 steps=steps, metadata={"source": trace.metadata.get("source"), "mutated_from": trace.run_id,
                                        "mutation": mutation, "call": target.call_id, "diverged": diverged})
