"""The facts of a call a status rule can read: from its arguments, the run's earlier calls and what the
logged calls showed. Plain to read off, so read, not generated (`status_rules` learns which of them come
with a failure).

The facts of a call, from its arguments and the run's earlier calls (as the rehearse request holds them):

- `unseen <arg>`: the argument's text never appeared in a logged successful reply (another run's: the
  learning is leave-one-run-out) nor in an earlier successful reply of this run;
- the *state* of what the call names: the objects in earlier successful replies whose field of an
  argument's name holds the argument's value (an item whose `sku` is the call's `sku`; for an argument
  named `<x>_id`, an object's `id` too), latest value per field: `<field> = true` / `false` /
  `"<short text>"`, and `<numeric arg> > <field>` where the argument exceeds a number of that state;
- `<numeric arg> > <field> (run or log)`: the argument exceeds the number this run showed for what the call
  names or, where it showed none, the number other runs' replies showed (a room's `seats`, when this run
  never listed the rooms): what the log knows of objects that outlive a run, counted with what the run
  knows, so the rule sees every call whose number is known;
- `<arg> > <arg>` / `<arg> = <arg>`: how two of the call's arguments compare (numbers, or texts written
  alike: dates, times), as a range whose end is not after its start;
- `after <tool> with <arg>` / `after failed <tool> with <arg>`: an earlier call of the run had the same
  value for that argument.

All of it bounded: a reply, an argument list or a log of any size or depth gives a bounded set of facts.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from envace_mcp.policy.fidelity import field_name, leaves, parsed_json, same_value
from envace_mcp.policy.prompts import content_text
from envace_mcp.policy.types import RehearseRequest

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
MAX_LOGGED = 20_000
"""Objects' numbers kept from the log (key, value, field), for `(run or log)` facts."""
LOGGED = " (run or log)"
"""How a fact read off the log, not the run, ends."""

def facts(request: RehearseRequest, known: Any = None, logged: Any = None) -> set[str]:
    """The call's facts (see the module). `known`: the texts logged replies showed (`in` is all it needs);
    None: no `unseen` facts. `logged`: the numbers logged replies showed of objects (`LoggedNumbers`, or
    its leave-one-run-out view); None: no `(run or log)` facts. Bounded: the last `MAX_EARLIER` earlier calls,
    `MAX_OBJECTS` objects of each reply, `MAX_ARGUMENTS` arguments; a reply nested past what Python can
    walk gives no facts."""
    try:
        return _facts(request, known, logged)
    except RecursionError:
        return set()


def _facts(request: RehearseRequest, known: Any, logged: Any) -> set[str]:
    given = _given(request)
    texts = _texts(given)
    numbers = {p: v for p, v in given.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    earlier = _earlier_calls(request)
    shown_texts = {v for _, _, reply, ok in earlier if ok for v in leaves(reply).values() if isinstance(v, str)}
    objects = _shown(earlier)
    out = _compared(numbers, texts)
    for path, value in texts.items():
        name = field_name(path)
        if known is not None and value not in known and value not in shown_texts:
            out.add(f"unseen {name}")
        keys = _keys(name)
        state = state_of(objects, name, value)
        for key, field_value in state.items():
            if isinstance(field_value, bool):
                out.add(f"{key} = {'true' if field_value else 'false'}")
            elif isinstance(field_value, str) and len(field_value) <= SHORT:
                out.add(f"{key} = {json.dumps(field_value, ensure_ascii=False)}")
            elif isinstance(field_value, (int, float)):
                out.update(f"{field_name(n)} > {key}" for n, x in numbers.items() if x > field_value)
        if logged is not None:
            best = {**logged.numbers(keys, value),  # what this run showed is fresher
                    **{k: v for k, v in state.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}}
            for key, field_value in best.items():
                if key in keys:
                    continue
                out.update(f"{field_name(n)} > {key}{LOGGED}" for n, x in numbers.items() if x > field_value)
        for tool, args, _, ok in earlier:
            if isinstance(args, dict) and same_value(args.get(name, _MISSING), value):
                out.add(f"after {'' if ok else 'failed '}{tool} with {name}")
    return out


def _given(request: RehearseRequest) -> dict[str, Any]:
    """The call's plain arguments (path -> value; not inside lists), the first `MAX_ARGUMENTS`."""
    arguments = request.call.arguments if isinstance(request.call.arguments, dict) else {}
    return dict(list((path, v) for path, v in leaves(arguments).items()
                     if "[" not in path and not isinstance(v, (dict, list)))[:MAX_ARGUMENTS])


def _texts(given: dict[str, Any]) -> dict[str, str]:
    return {p: v for p, v in given.items() if isinstance(v, str) and 0 < len(v) <= MAX_TEXT}


def text_arguments(request: RehearseRequest) -> dict[str, str]:
    """The call's text arguments a state is read for (path -> text; not inside lists, bounded)."""
    return _texts(_given(request))


def objects_shown(request: RehearseRequest) -> list[dict[str, Any]]:
    """The objects of the run's earlier successful replies, oldest first (bounded as `facts` reads them)."""
    return _shown(_earlier_calls(request))


def _shown(earlier: list[tuple[str, Any, Any, bool]]) -> list[dict[str, Any]]:
    return [obj for _, _, reply, ok in earlier if ok for obj in _objects(reply)[:MAX_OBJECTS]]


def state_of(objects: Iterable[dict[str, Any]], name: str, value: Any) -> dict[str, Any]:
    """The *state* of what an argument called `name` with `value` names: the plain fields of the objects that
    name it (`_keys`), latest value per field, the naming fields left out."""
    keys = _keys(name)
    state: dict[str, Any] = {}
    for obj in objects:
        if any(key in obj and same_value(obj[key], value) for key in keys):
            state.update({k: v for k, v in obj.items() if not isinstance(v, (dict, list)) and k not in keys})
    return state


def _keys(name: str) -> set[str]:
    """The fields of an object that name it as an argument called `name` names it (an argument `room_id`
    names the object whose `room_id` or `id` it holds)."""
    return {name, "id"} if name.endswith("_id") else {name}


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


class LeaveOneOut:
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


class LoggedNumbers:
    """The numbers logged replies showed of the objects a call can name: for an object's naming field and
    value (a room's `id` "R-1"), each number field's latest value (its `seats`), per run that showed it (at
    most two runs kept: enough for another run's)."""

    def __init__(self, shown: dict[tuple[str, str], dict[str, dict[str, float]]] | None = None) -> None:
        self.shown = shown or {}

    @classmethod
    def of(cls, calls: Iterable[Any]) -> LoggedNumbers:
        """From logged calls (`worldmodel.calls.Observed`): the objects of their successful replies, keyed by
        each field a call's argument can name them by (`_keys`), at most `MAX_LOGGED` keys."""
        calls = list(calls)
        names = {"id"}
        for call in calls:
            arguments = call.request.call.arguments
            try:
                names.update(map(field_name, list(leaves(arguments))[:MAX_ARGUMENTS] if isinstance(arguments, dict) else ()))
            except RecursionError:  # nested past what Python can walk: names nothing
                continue
        shown: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
        for call in calls:
            if call.failed:
                continue
            try:
                objects = _objects(parsed_json(call.value))
            except RecursionError:
                continue
            for obj in objects:
                found = {k: v for k, v in obj.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                for key in names & obj.keys() if found else ():
                    value = obj[key]
                    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT:
                        continue
                    if (key, value) not in shown and len(shown) >= MAX_LOGGED:
                        continue
                    fields = shown.setdefault((key, value), {})
                    for field, number in found.items():
                        runs = fields.setdefault(field, {})
                        if call.episode in runs or len(runs) < 2:
                            runs[call.episode] = number
        return cls(shown)

    def numbers(self, keys: Iterable[str], value: str, run: str | None = None) -> dict[str, float]:
        """Each number field of the object named `value` by one of `keys`, as a run other than `run` showed it."""
        out: dict[str, float] = {}
        for key in sorted(keys):
            for field, runs in self.shown.get((key, value), {}).items():
                other = [x for r, x in runs.items() if r != run]
                if other and field not in keys:
                    out.setdefault(field, other[-1])
        return out

    def without(self, run: str) -> Any:
        """The numbers as runs other than `run` showed them (learning is leave-one-run-out)."""
        return _WithoutRun(self, run)

    def kept(self, facts: Iterable[str]) -> list[list[Any]]:
        """[key, value, field, number] for each number a `(run or log)` fact among `facts` reads (a rule's), as a
        rules file stores them: the latest run's."""
        fields = {f[:-len(LOGGED)].rpartition(" > ")[2] for f in facts if f.endswith(LOGGED)}
        return [[key, value, name, list(runs.values())[-1]] for (key, value), found in self.shown.items()
                for name, runs in found.items() if name in fields][:MAX_LOGGED]


@dataclass(frozen=True)
class _WithoutRun:
    logged: LoggedNumbers
    run: str

    def numbers(self, keys: Iterable[str], value: str) -> dict[str, float]:
        return self.logged.numbers(keys, value, self.run)


