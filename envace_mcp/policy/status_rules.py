"""Failures a world model foresees by rule, learned by counting a user's logged calls.

A 135M model fitted on a few hundred calls rarely foresees a failure whose cause is a fact: an id no reply
ever showed, a quantity above the `available` an earlier reply gave for that item, an item shown
`discontinued`, a reservation this run already cancelled. Those facts are plain to read off the call and the
run, so they are read, not generated: each call's *facts* are listed (`facts`), and a fact that came with a
failure in nearly every logged call of a tool becomes that tool's rule. A rehearsal whose call has a rule's
fact predicts the failure, whatever the model wrote, and says which rule decided it
(`Prediction.ruled`). Rules only ever predict failures, so a rules file can make the gate stricter, never
looser.

The facts are read by `call_facts` (listed there).

    learned = learn(calls)                     # rules (tool -> [StatusRule]), known texts, logged numbers
    write_rules(folder, learned, identities)   # status_rules.json, each tool's rules bound to its identity
    table = read_rules(folder)                 # None where the folder has none (or it is unreadable)
    prediction = table.apply(prediction, request)

The file is read as untrusted input (`copying.read_bound`): bounded, a rule that is not well formed dropped,
a tool whose server or schemas differ from the ones its rules were learned on gets none.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace_mcp.policy.call_facts import (
    MAX_LOGGED,
    MAX_TEXT,
    LeaveOneOut,
    LoggedNumbers,
    facts,
    known_texts,
)
from envace_mcp.policy.copying import BoundRules, Identity, bound, read_bound, read_extra, write_bound
from envace_mcp.policy.types import Prediction, RehearseRequest

if TYPE_CHECKING:
    from envace_mcp.toolbox.catalog import ToolSpec

RULES_FILE = "status_rules.json"
MAX_BYTES = 8 << 20
MIN_SUPPORT = 5
"""Logged calls of a tool with the fact that a rule on a value needs (`status = "cancelled"`: a log shows one
such fact per value a field takes, so by chance alone some come with a few failures)…"""
MIN_RELATION_SUPPORT = 3
"""…that a rule on how the call relates to its arguments and the run needs (`unseen room_id`, `quantity >
available`, `after cancel with id`: a few per tool, so a few calls suffice)…"""
MIN_HELD = 0.9
"""…and the share of them that failed."""
MAX_RULES = 32
"""Rules kept per tool."""
MAX_KNOWN = 20_000
"""Texts kept as known (no `unseen` rule is learned from a log that shows more)."""


@dataclass(frozen=True)
class StatusRule:
    """Calls of a tool with `fact` failed in `held` of the `support` logged calls that had it."""

    fact: str
    support: int
    held: float

    def words(self) -> str:
        return f"{self.fact} (failed in {self.held:.0%} of {self.support})"


@dataclass(frozen=True)
class Learned:
    """What `learn` found: each tool's rules; the known texts and logged numbers they read (kept only where
    a rule needs them); and, per tool, (failed, calls) of the logged calls no rule covers — how often the
    tool fails where no rule says so, which a rehearsal's P(error) is calibrated with (`calibrated`)."""

    rules: dict[str, list[StatusRule]]
    known: list[str]
    logged: list[list[Any]]
    unforeseen: dict[str, tuple[int, int]]


def learn(calls: Iterable[Any]) -> Learned:
    """The status rules of logged calls (`worldmodel.calls.Observed`), what they read, and each tool's
    unforeseen failures (`Learned`). Facts are counted leave-one-run-out; `unseen` facts not at all where the
    log shows more than `MAX_KNOWN` texts or more than half of what a rules file may hold (so the file the
    rules are written to can always be read back)."""
    calls = list(calls)
    runs_of = known_texts(calls)
    use_known = (len(runs_of) <= MAX_KNOWN
                 and sum(len(json.dumps(t, ensure_ascii=False).encode()) + 3 for t in runs_of) <= MAX_BYTES // 2)
    logged = LoggedNumbers.of(calls)
    tally: dict[str, dict[str, list[int]]] = {}
    found_facts = []
    for call in calls:
        known = LeaveOneOut(runs_of, call.episode) if use_known else None
        counts = tally.setdefault(call.tool, {})
        found = facts(call.request, known, logged.without(call.episode))
        found_facts.append(found)
        for fact in found:
            seen = counts.setdefault(fact, [0, 0])
            seen[0] += call.failed
            seen[1] += 1
    rules: dict[str, list[StatusRule]] = {}
    for tool, counts in sorted(tally.items()):
        found = sorted((StatusRule(fact, n, round(failed / n, 4)) for fact, (failed, n) in counts.items()
                        if n >= support_needed(fact) and failed / n >= MIN_HELD), key=lambda r: (-r.held, -r.support, r.fact))
        kept, covered = [], []
        for rule in found:  # one that fires only where a rule held as often already does says nothing more
            where = frozenset(i for i, f in enumerate(found_facts) if calls[i].tool == tool and rule.fact in f)
            if not any(where <= other for other in covered):
                kept.append(rule)
                covered.append(where)
        if kept:
            rules[tool] = kept[:MAX_RULES]
    unforeseen: dict[str, list[int]] = {}
    for call, found in zip(calls, found_facts):
        if not any(r.fact in found for r in rules.get(call.tool, [])):
            seen = unforeseen.setdefault(call.tool, [0, 0])
            seen[0] += call.failed
            seen[1] += 1
    every = [r for found in rules.values() for r in found]
    known_kept = sorted(runs_of) if use_known and any(r.fact.startswith("unseen ") for r in every) else []
    return Learned(rules, known_kept, logged.kept(r.fact for r in every), {t: (k, n) for t, (k, n) in sorted(unforeseen.items())})


_VALUE_FACT = re.compile(r' = (?:true|false|".*")$')


def support_needed(fact: str) -> int:
    """Logged calls with `fact` a rule needs: `MIN_SUPPORT` where the fact names a value, else
    `MIN_RELATION_SUPPORT`."""
    return MIN_SUPPORT if _VALUE_FACT.search(fact) else MIN_RELATION_SUPPORT


def calibrated(p_error: float, unforeseen: tuple[int, int] | None) -> float:
    """P(error) of a rehearsal no rule decided: the model's, or else a failure of the kind the tool's logged
    calls showed where no rule foresaw one — p + (1 − p)·r, r the share of those calls that failed (smoothed:
    (failed + ½) / (calls + 1)). A 135M model says "succeeds" at P(error) under 0.01 on calls that fail one
    time in nine; this keeps its ranking and makes the figure mean what it says (docs/evidence.md)."""
    if unforeseen is None:
        return p_error
    failed, n = unforeseen
    rate = (failed + 0.5) / (n + 1)
    return p_error + (1 - p_error) * rate


def predicted(prediction: Prediction, request: RehearseRequest, rules: list[StatusRule], known: Any,
              logged: Any = None, unforeseen: tuple[int, int] | None = None) -> Prediction:
    """`prediction` as a predicted failure where the call has a rule's fact (the rule that held most often
    decides, and says so); else with its P(error) `calibrated` by the tool's unforeseen failures. An
    unusable rehearsal stays unusable (a gate that fails closed on it must still), and a partial one stays
    partial (`Prediction.partial`)."""
    if prediction.status == "invalid":
        return prediction
    rule = None
    if rules:
        found = facts(request, known, logged)
        rule = next((r for r in rules if r.fact in found), None)
    if rule is None:
        if prediction.p_error is None or unforeseen is None:
            return prediction
        p_error = calibrated(prediction.p_error, unforeseen)
        return prediction.model_copy(update={"p_error": p_error, "confidence": (
            p_error if prediction.status == "tool_error" else 1 - p_error if prediction.status == "result" else None)})
    message = f"predicted by rule: {rule.words()}"
    p_error = max(rule.held, prediction.p_error or 0.0)
    return prediction.model_copy(update={
        "status": "tool_error", "code": "EXECUTION_ERROR",
        "message": prediction.message if prediction.status == "tool_error" else message,
        "result": prediction.result if prediction.status == "tool_error" else {
            "error_tool_call": {"code": "EXECUTION_ERROR", "message": message}},
        "p_error": p_error, "confidence": p_error, "ruled": rule.fact, "copied": []})


@dataclass(frozen=True)
class StatusTable(BoundRules):
    """Status rules by tool, each tool's bound to the (server, behaviour) it was learned on; the texts the
    logged replies showed (for `unseen` facts) and the numbers they showed (for `(run or log)` facts); and each
    tool's unforeseen failures, bound likewise (for `calibrated`)."""

    known: frozenset[str] = frozenset()
    source: str | None = None
    logged: LoggedNumbers | None = None
    unforeseen: dict[str, tuple[Identity, tuple[int, int]]] = field(default_factory=dict)

    def summary(self) -> dict[str, list[str]]:
        """Each tool's rules in words, as a report states them."""
        return {tool: [f"fails when {r.words()}" for r in rules] for tool, (_, rules) in sorted(self.tools.items())}

    def unforeseen_of(self, spec: ToolSpec | None) -> tuple[int, int] | None:
        """(failed, calls) of `spec`'s tool where no rule foresaw a failure, if learned on this very tool."""
        return bound(self.unforeseen, spec)

    def apply(self, prediction: Prediction, request: RehearseRequest) -> Prediction:
        return predicted(prediction, request, self.for_tool(request.tool), self.known, self.logged,
                         self.unforeseen_of(request.tool))


def write_rules(folder: str | Path, learned: Learned, identities: dict[str, Identity]) -> Path:
    """`status_rules.json` in `folder`: each tool's rules and unforeseen failures with the (server,
    behaviour) they were learned on, the known texts and the logged numbers."""
    return write_bound(Path(folder) / RULES_FILE, {t: learned.rules.get(t, []) for t in
                                                   sorted({*learned.rules, *learned.unforeseen})}, identities,
                       {t: {"unforeseen": list(counts)} for t, counts in learned.unforeseen.items()},
                       known=learned.known, logged=learned.logged)


def read_rules(folder: str | Path | None) -> StatusTable | None:
    """A folder's status rules; None where it has none, or the file is too large or not JSON. A rule that
    is not well formed is dropped, and so are known texts that are not texts, logged numbers that are not
    [key, value, field, number] and unforeseen counts that are not 0 ≤ failed ≤ calls."""
    if folder is None:
        return None
    path = Path(folder) / RULES_FILE
    read = read_bound(path, MAX_BYTES, MAX_RULES, _rule)
    if read is None:
        return None
    table, data = read
    known = data.get("known")
    texts = frozenset(t for t in known[:MAX_KNOWN] if isinstance(t, str)) if isinstance(known, list) else frozenset()
    return StatusTable(table, texts, source=str(path), logged=logged_numbers(data.get("logged")),
                       unforeseen=read_extra(data["tools"], "unforeseen", _counts))


def logged_numbers(entries: Any) -> LoggedNumbers | None:
    """`Learned.logged` (as a rules file stores it) as the `LoggedNumbers` facts read; what is not
    [key, value, field, finite number] is dropped."""
    if not isinstance(entries, list):
        return None
    shown: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    for entry in entries[:MAX_LOGGED]:
        if (isinstance(entry, list) and len(entry) == 4 and all(isinstance(x, str) for x in entry[:3])
                and isinstance(entry[3], (int, float)) and not isinstance(entry[3], bool) and math.isfinite(entry[3])):
            shown.setdefault((entry[0], entry[1]), {})[entry[2]] = {"": entry[3]}
    return LoggedNumbers(shown)


def _counts(counts: Any) -> tuple[int, int] | None:
    if (isinstance(counts, list) and len(counts) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in counts) and 0 <= counts[0] <= counts[1]):
        return counts[0], counts[1]
    return None


def _rule(data: Any) -> StatusRule | None:
    if not isinstance(data, dict):
        return None
    fact, support, held = data.get("fact"), data.get("support"), data.get("held")
    if not (isinstance(fact, str) and 0 < len(fact) <= 2 * MAX_TEXT
            and isinstance(support, int) and not isinstance(support, bool) and support >= support_needed(fact)
            and isinstance(held, (int, float)) and not isinstance(held, bool) and MIN_HELD <= held <= 1):
        return None
    return StatusRule(fact, support, float(held))
