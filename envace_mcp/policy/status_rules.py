"""Failures a world model foresees by rule, learned by counting a user's logged calls.

A 135M model fitted on a few hundred calls rarely foresees a failure whose cause is a fact: an id no reply
ever showed, a quantity above the `available` an earlier reply gave for that item, an item shown
`discontinued`, a reservation this run already cancelled. Those facts are plain to read off the call and the
run, so they are read, not generated: each call's *facts* are listed (`facts`), and a fact that came with a
failure in nearly every logged call of a tool becomes that tool's rule. A rehearsal whose call has a rule's
fact predicts the failure, whatever the model wrote, and says which rule decided it
(`Prediction.ruled`). Rules only ever predict failures, so a rules file can make the gate stricter, never
looser.

The facts of a call, from its arguments and the run's earlier calls (as the rehearse request holds them):

- `unseen <arg>`: the argument's text never appeared in a logged successful reply (another run's: the
  learning is leave-one-run-out) nor in an earlier successful reply of this run;
- the *state* of what the call names: the objects in earlier successful replies whose field of an
  argument's name holds the argument's value (an item whose `sku` is the call's `sku`; for an argument
  named `<x>_id`, an object's `id` too), latest value per field: `<field> = true` / `false` /
  `"<short text>"`, and `<numeric arg> > <field>` where the argument exceeds a number of that state;
- `<arg> > <arg>` / `<arg> = <arg>`: how two of the call's arguments compare (numbers, or texts written
  alike: dates, times), as a range whose end is not after its start;
- `after <tool> with <arg>` / `after failed <tool> with <arg>`: an earlier call of the run had the same
  value for that argument.

    rules, known = learn(calls)                # tool -> [StatusRule]; calls: worldmodel.calls.Observed
    write_rules(folder, rules, known, identities)   # status_rules.json, each tool's rules bound to its identity
    table = read_rules(folder)                 # None where the folder has none (or it is unreadable)
    prediction = table.apply(prediction, request)

The file is read as untrusted input (`copying.read_bound`): bounded, a rule that is not well formed dropped,
a tool whose server or schemas differ from the ones its rules were learned on gets none.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from envace_mcp.policy.copying import BoundRules, Identity, read_bound, write_bound
from envace_mcp.policy.fidelity import field_name, leaves, parsed_json, same_value
from envace_mcp.policy.prompts import content_text
from envace_mcp.policy.types import Prediction, RehearseRequest

RULES_FILE = "status_rules.json"
MAX_BYTES = 8 << 20
MIN_SUPPORT = 5
"""Logged calls of a tool with the fact that a rule needs…"""
MIN_HELD = 0.9
"""…and the share of them that failed."""
MAX_RULES = 32
"""Rules kept per tool."""
MAX_KNOWN = 20_000
"""Texts kept as known (no `unseen` rule is learned from a log that shows more)."""
MAX_TEXT = 200
"""Longest text kept as known, and longest argument text an `unseen` fact is about."""
SHORT = 40
"""Longest field text a state fact names (a status, a category; not a description)."""
MAX_EARLIER = 50
"""Earlier calls of the run a call's facts are read from (the latest)."""
MAX_OBJECTS = 1000
"""Objects read from one earlier reply."""
MAX_ARGUMENTS = 32
"""Arguments of a call its facts are read from (and compared pairwise)."""


@dataclass(frozen=True)
class StatusRule:
    """Calls of a tool with `fact` failed in `held` of the `support` logged calls that had it."""

    fact: str
    support: int
    held: float

    def words(self) -> str:
        return f"{self.fact} (failed in {self.held:.0%} of {self.support})"


def facts(request: RehearseRequest, known: Any = None) -> set[str]:
    """The call's facts (see the module). `known`: the texts logged replies showed (`in` is all it needs);
    None: no `unseen` facts. Bounded: the last `MAX_EARLIER` earlier calls, `MAX_OBJECTS` objects of each
    reply, `MAX_ARGUMENTS` arguments; a reply nested past what Python can walk gives no facts."""
    try:
        return _facts(request, known)
    except RecursionError:
        return set()


def _facts(request: RehearseRequest, known: Any) -> set[str]:
    arguments = request.call.arguments if isinstance(request.call.arguments, dict) else {}
    given = dict(list((path, v) for path, v in leaves(arguments).items()
                      if "[" not in path and not isinstance(v, (dict, list)))[:MAX_ARGUMENTS])
    texts = {p: v for p, v in given.items() if isinstance(v, str) and 0 < len(v) <= MAX_TEXT}
    numbers = {p: v for p, v in given.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    earlier = _earlier_calls(request)
    shown_texts: set[str] = set()
    objects: list[dict[str, Any]] = []
    for _, _, reply, ok in earlier:
        if ok:
            shown_texts.update(v for v in leaves(reply).values() if isinstance(v, str))
            objects += _objects(reply)[:MAX_OBJECTS]
    out = _compared(numbers, texts)
    for path, value in texts.items():
        name = field_name(path)
        if known is not None and value not in known and value not in shown_texts:
            out.add(f"unseen {name}")
        keys = {name, "id"} if name.endswith("_id") else {name}
        state: dict[str, Any] = {}
        for obj in objects:
            if any(key in obj and same_value(obj[key], value) for key in keys):
                state.update({k: v for k, v in obj.items() if not isinstance(v, (dict, list))})
        for key, field_value in state.items():
            if key in keys:
                continue
            if isinstance(field_value, bool):
                out.add(f"{key} = {'true' if field_value else 'false'}")
            elif isinstance(field_value, str) and len(field_value) <= SHORT:
                out.add(f"{key} = {json.dumps(field_value, ensure_ascii=False)}")
            elif isinstance(field_value, (int, float)):
                out.update(f"{field_name(n)} > {key}" for n, x in numbers.items() if x > field_value)
        for tool, args, _, ok in earlier:
            if isinstance(args, dict) and same_value(args.get(name, _MISSING), value):
                out.add(f"after {'' if ok else 'failed '}{tool} with {name}")
    return out


_MISSING = object()
_ORDERED = re.compile(r"[0-9][0-9:.\-T ]*")


def _compared(numbers: dict[str, Any], texts: dict[str, str]) -> set[str]:
    """`a > b` and `a = b` for each two arguments that compare: numbers, or texts of one length written
    only with digits and date/time marks."""
    out: set[str] = set()
    for group in (numbers, {p: v for p, v in texts.items() if _ORDERED.fullmatch(v)}):
        items = list(group.items())
        for i, (a, x) in enumerate(items):
            for b, y in items[i + 1:]:
                if isinstance(x, str) and len(x) != len(y):
                    continue
                if x == y:
                    out.add(f"{field_name(a)} = {field_name(b)}")
                else:
                    big, small = (a, b) if x > y else (b, a)
                    out.add(f"{field_name(big)} > {field_name(small)}")
    return out


def _earlier_calls(request: RehearseRequest) -> list[tuple[str, Any, Any, bool]]:
    """(tool, arguments, reply as JSON, succeeded) of the last `MAX_EARLIER` earlier calls in the request's
    history (only those replies are parsed)."""
    calls: dict[str, tuple[str, Any]] = {}
    replies = []
    for message in request.history:
        if isinstance(message, AIMessage):
            for call in message.tool_calls or []:
                calls[call.get("id") or ""] = (call.get("name") or "", call.get("args"))
        elif isinstance(message, ToolMessage):
            replies.append((*calls.get(message.tool_call_id or "", (message.name or "", None)), message))
    return [(tool, args, parsed_json(content_text(message.content)), message.status != "error")
            for tool, args, message in replies[-MAX_EARLIER:]]


def _objects(value: Any) -> list[dict[str, Any]]:
    """Every object in a JSON value, outermost first (breadth first, without recursion)."""
    out, queue = [], collections.deque([value])
    while queue and len(out) < MAX_OBJECTS:
        item = queue.popleft()
        if isinstance(item, dict):
            out.append(item)
            queue.extend(item.values())
        elif isinstance(item, list):
            queue.extend(item)
    return out


class _LeaveOneOut:
    """The texts shown in successful replies of runs other than `run`."""

    def __init__(self, runs_of: dict[str, set[str]], run: str) -> None:
        self.runs_of, self.run = runs_of, run

    def __contains__(self, text: object) -> bool:
        runs = self.runs_of.get(text) if isinstance(text, str) else None
        return bool(runs) and (len(runs) > 1 or self.run not in runs)


def known_texts(calls: Iterable[Any]) -> dict[str, set[str]]:
    """Each text shown in a successful logged reply, with the runs that showed it (at most two kept: enough
    to know whether another run did)."""
    runs_of: dict[str, set[str]] = {}
    for call in calls:
        if call.failed:
            continue
        try:
            shown = leaves(parsed_json(call.value)).values()
        except RecursionError:  # nested past what Python can walk: shows nothing
            continue
        for leaf in shown:
            if isinstance(leaf, str) and len(leaf) <= MAX_TEXT:
                runs = runs_of.setdefault(leaf, set())
                if len(runs) < 2:
                    runs.add(call.episode)
    return runs_of


def learn(calls: Iterable[Any]) -> tuple[dict[str, list[StatusRule]], list[str]]:
    """(each tool's status rules, the known texts to store with them) from logged calls
    (`worldmodel.calls.Observed`). `unseen` facts are counted leave-one-run-out, and not at all where the
    log shows more than `MAX_KNOWN` texts or more than half of what a rules file may hold (so the file the
    rules are written to can always be read back)."""
    calls = list(calls)
    runs_of = known_texts(calls)
    use_known = (len(runs_of) <= MAX_KNOWN
                 and sum(len(json.dumps(t, ensure_ascii=False).encode()) + 3 for t in runs_of) <= MAX_BYTES // 2)
    tally: dict[str, dict[str, list[int]]] = {}
    for call in calls:
        known = _LeaveOneOut(runs_of, call.episode) if use_known else None
        counts = tally.setdefault(call.tool, {})
        for fact in facts(call.request, known):
            seen = counts.setdefault(fact, [0, 0])
            seen[0] += call.failed
            seen[1] += 1
    rules: dict[str, list[StatusRule]] = {}
    for tool, counts in sorted(tally.items()):
        found = [StatusRule(fact, n, round(failed / n, 4)) for fact, (failed, n) in counts.items()
                 if n >= MIN_SUPPORT and failed / n >= MIN_HELD]
        if found:
            rules[tool] = sorted(found, key=lambda r: (-r.held, -r.support, r.fact))[:MAX_RULES]
    return rules, sorted(runs_of) if use_known and any(
        r.fact.startswith("unseen ") for found in rules.values() for r in found) else []


def predicted(prediction: Prediction, request: RehearseRequest, rules: list[StatusRule], known: Any) -> Prediction:
    """`prediction` as a predicted failure where the call has a rule's fact (the rule that held most often
    decides, and says so); else as it is. An unusable rehearsal stays unusable (a gate that fails closed on
    it must still), and a partial one stays partial (`Prediction.partial`)."""
    if not rules or prediction.status == "invalid":
        return prediction
    found = facts(request, known)
    rule = next((r for r in rules if r.fact in found), None)
    if rule is None:
        return prediction
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
    """Status rules by tool, each tool's bound to the (server, behaviour) it was learned on, and the texts
    the logged replies showed (for `unseen` facts)."""

    known: frozenset[str] = frozenset()
    source: str | None = None

    def summary(self) -> dict[str, list[str]]:
        """Each tool's rules in words, as a report states them."""
        return {tool: [f"fails when {r.words()}" for r in rules] for tool, (_, rules) in sorted(self.tools.items())}

    def apply(self, prediction: Prediction, request: RehearseRequest) -> Prediction:
        return predicted(prediction, request, self.for_tool(request.tool), self.known)


def write_rules(folder: str | Path, rules: dict[str, list[StatusRule]], known: list[str],
                identities: dict[str, Identity]) -> Path:
    """`status_rules.json` in `folder`: each tool's rules with the (server, behaviour) they were learned on,
    and the known texts."""
    return write_bound(Path(folder) / RULES_FILE, rules, identities, known=known)


def read_rules(folder: str | Path | None) -> StatusTable | None:
    """A folder's status rules; None where it has none, or the file is too large or not JSON. A rule that
    is not well formed is dropped, and so are known texts that are not texts."""
    if folder is None:
        return None
    path = Path(folder) / RULES_FILE
    read = read_bound(path, MAX_BYTES, MAX_RULES, _rule)
    if read is None:
        return None
    table, data = read
    known = data.get("known")
    texts = frozenset(t for t in known[:MAX_KNOWN] if isinstance(t, str)) if isinstance(known, list) else frozenset()
    return StatusTable(table, texts, source=str(path))


def _rule(data: Any) -> StatusRule | None:
    if not isinstance(data, dict):
        return None
    fact, support, held = data.get("fact"), data.get("support"), data.get("held")
    if not (isinstance(fact, str) and 0 < len(fact) <= 2 * MAX_TEXT
            and isinstance(support, int) and not isinstance(support, bool) and support >= MIN_SUPPORT
            and isinstance(held, (int, float)) and not isinstance(held, bool) and MIN_HELD <= held <= 1):
        return None
    return StatusRule(fact, support, float(held))
