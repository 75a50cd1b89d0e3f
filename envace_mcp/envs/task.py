"""A task of a suite and its check: what the agent is asked, what a correct run makes and ends with.

Pure records and functions: a domain's own tool functions (`Apply`) replay reference actions, and the
checker compares final states and answers. The bundled servers build their suites from these; τ² and
BFCL map their official tasks onto them.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal


class DomainError(Exception):
    """A business-rule failure (insufficient funds, order not cancellable): an `isError` result."""


@dataclass(frozen=True)
class Action:
    """One tool call of a reference solution."""

    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Requirement:
    """Something the final answer must contain: a number (compared numerically) or a phrase."""

    kind: Literal["number", "text"]
    value: float | str

    def satisfied_by(self, answer: str) -> bool:
        if self.kind == "number":
            return any(abs(n - float(self.value)) < 0.005 for n in numbers_in(answer))
        return str(self.value).lower() in answer.lower()


@dataclass(frozen=True)
class Task:
    """One task of a suite: instruction, initial state, reference solution and what to check.

    `outcome` says what a correct agent ends with: `success` (the request is carried out),
    `error` (the request cannot be carried out and the agent says why) or `refusal` (policy
    forbids it; `trap` is the careless destructive call that a correct agent does not make).
    """

    id: str
    domain: str
    split: Literal["train", "test"]
    kind: str
    instruction: str
    initial_state: dict[str, Any]
    actions: tuple[Action, ...]
    answer: str
    requirements: tuple[Requirement, ...] = ()
    outcome: Literal["success", "error", "refusal"] = "success"
    trap: Action | None = None
    writes: tuple[str, ...] = field(default=(), repr=False)
    """Names of the domain's state-changing tools (to find "the last write" in tests and tools)."""
    turns: tuple[str, ...] = ()
    """Later user messages of a multi-turn task (BFCL), each sent once the agent answered the last."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def write_actions(self) -> list[Action]:
        return [a for a in self.actions if a.tool in self.writes]


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class CheckResult:
    """The checker's verdict: score in [0, 1] (the fraction of checks passed) and every check."""

    score: float
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return self.score >= 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score, "checks": [asdict(c) for c in self.checks]}


Apply = Callable[[dict[str, Any], str, dict[str, Any]], Any]
"""A domain's tool functions: `apply(state, tool, arguments)` changes `state` and returns the result,
raising `DomainError` for a business-rule failure."""


def replay(initial_state: Mapping[str, Any], actions: Sequence[Action], apply: Apply) -> dict[str, Any]:
    """Run actions on a copy of a state with the domain's own tool functions; errors leave state as is."""
    state = copy.deepcopy(dict(initial_state))
    for action in actions:
        try:
            apply(state, action.tool, dict(action.arguments))
        except DomainError:
            pass
    return state


def check_task(task: Task, final_state: Mapping[str, Any], answer: str, apply: Apply) -> CheckResult:
    """τ²-style check: the final state must equal the reference actions' final state, and the
    answer must contain every required number or phrase. Score = fraction of checks passed."""
    expected = replay(task.initial_state, task.actions, apply)
    differences = diff_states(expected, dict(final_state))
    checks = [Check("state", not differences, "; ".join(differences[:5]))]
    for req in task.requirements:
        label = f"answer has {req.value:.2f}" if req.kind == "number" else f"answer mentions {req.value!r}"
        checks.append(Check(label, req.satisfied_by(answer or "")))
    score = sum(c.passed for c in checks) / len(checks)
    return CheckResult(score=round(score, 6), checks=tuple(checks))


def diff_states(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Human-readable differences between two JSON-like values (empty when equal)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out: list[str] = []
        for key in sorted(set(expected) | set(actual), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in actual:
                out.append(f"{sub}: missing")
            elif key not in expected:
                out.append(f"{sub}: unexpected")
            else:
                out.extend(diff_states(expected[key], actual[key], sub))
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: {len(actual)} entries, expected {len(expected)}"]
        out = []
        for i, (e, a) in enumerate(zip(expected, actual)):
            out.extend(diff_states(e, a, f"{path}[{i}]"))
        return out
    if isinstance(expected, float) or isinstance(actual, float):
        try:
            if abs(float(expected) - float(actual)) < 0.005:
                return []
        except (TypeError, ValueError):
            pass
    return [] if expected == actual else [f"{path}: {actual!r}, expected {expected!r}"]


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def numbers_in(text: str) -> list[float]:
    """Numbers in free text, tolerating `$1,234.50` and `1 234.5`."""
    cleaned = re.sub(r"(?<=\d)[,\u00a0 ](?=\d{3}\b)", "", text.replace("$", ""))
    return [float(m) for m in _NUMBER.findall(cleaned)]


def money(value: float) -> float:
    return round(float(value) + 0.0, 2)
