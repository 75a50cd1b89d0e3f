"""Reply fields the user's log already answers: what a tool replied before to the same arguments.

Two shapes of one fact, both learned by counting repeats in a fit's training calls (in log order, each
repeat against the latest earlier reply to the same arguments):

- `Stable`: the whole reply to the same arguments repeated in nearly every logged repeat (a room catalog,
  a configuration), so a rehearsal is that logged reply, whole.
- `Lookup`: single fields repeated where the whole reply did not — the fields of a listing by category
  while the stock in it moves (`items[2].sku` given `category`), a room's name and hours in its day's
  schedule (`room_name` given `room_id`), an item's name given its `sku`. A lookup is keyed by one argument,
  or by all of them (`*`), and holds each field that repeated in `MIN_HELD` of at least `MIN_SUPPORT`
  repeats of that key; a rehearsal takes those fields from the logged reply to its call's key, including
  list elements the model did not write.

Learned from successful replies only; a field is a leaf path with its list indices (`items[2].sku`).
Read from a rules file as untrusted input: bounded, and an entry that is not well formed is dropped.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from envace_mcp.policy.fidelity import parsed_json, same_value

MIN_SUPPORT = 5
"""Repeats (or, for a copy rule, replies) a rule needs…"""
MIN_HELD = 0.95
"""…and the share of them it must hold in."""
MAX_REPLIES = 64
"""Logged replies (or keys' values) kept per stable tool or lookup (the most asked first)…"""
MAX_REPLY_BYTES = 16 << 10
"""…each at most this long as JSON…"""
MAX_LOGGED_BYTES = 512 << 10
"""…and all of a fit's kept replies and values together at most this long (half of what a rules file may be)."""
MAX_PATHS = 256
"""Fields kept per lookup (the first, in list order)…"""
MAX_LOOKUPS = 8
"""…lookups kept per tool…"""
MAX_INDEX = 255
"""…the last list element one may set…"""
MAX_MADE = 1024
"""…and the list elements and objects a rehearsal's lookups may make in all (a rules file cannot make a
prediction grow without bound)."""
MAX_PATH = 200
"""Longest field path learned or read."""
ALL = "*"
"""A lookup keyed by all of the call's arguments at once."""
_PATH = re.compile(r"(?:[^.\[\]]+|\[\d{1,3}\])(?:\.[^.\[\]]+|\[\d{1,3}\])*")
_KEY = re.compile(r"[^.\[\]]+")
_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")
_INDEX = re.compile(r"\[\d+\]")


def canonical(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _successes(calls: Iterable[Any]) -> Iterable[tuple[Any, Any, dict[str, Any]]]:
    """(call, reply, arguments) of the successful calls with JSON replies (objects or lists) and arguments."""
    for call in calls:
        reply = parsed_json(call.value)
        arguments = call.request.call.arguments
        if not call.failed and isinstance(reply, (dict, list)) and isinstance(arguments, dict):
            yield call, reply, arguments


@dataclass(frozen=True)
class Stable:
    """A tool whose successful reply to the same arguments equalled the latest logged one in `held` of the
    `support` logged repeats; `replies`: the latest logged reply to each arguments (canonical JSON) kept."""

    support: int
    held: float
    replies: dict[str, Any]

    def reply(self, arguments: Any) -> Any:
        """The logged reply to `arguments`, or None."""
        return self.replies.get(canonical(arguments)) if isinstance(arguments, dict) else None


def learn_replies(calls: Iterable[Any]) -> tuple[dict[str, Stable], dict[str, list[Lookup]], dict[str, str]]:
    """(`learn_stable`, `learn_lookups` of the other tools, `learn_kinds`), the kept replies and values within
    one budget."""
    calls, budget = list(calls), [MAX_LOGGED_BYTES]
    stable = learn_stable(calls, budget)
    return stable, learn_lookups(calls, stable, budget), learn_kinds(calls)


def learn_kinds(calls: Iterable[Any]) -> dict[str, str]:
    """Each tool that declares no `outputSchema` and whose successful replies were JSON of one kind, `"object"`
    or `"array"`, in `MIN_HELD` of at least `MIN_SUPPORT`: the kind its rehearsals are held to (the fitted
    SmolLM2 answered τ²-airline's flight search, a list in every logged reply, with a reservation object). A
    tool with an `outputSchema` is held to that schema instead, so its kind is not learned."""
    seen: dict[str, Counter[str]] = defaultdict(Counter)
    for call in calls:
        if not call.failed and call.spec.output_schema is None:
            reply = parsed_json(call.value)
            seen[call.tool]["object" if isinstance(reply, dict) else "array" if isinstance(reply, list) else ""] += 1
    out = {}
    for tool, kinds in sorted(seen.items()):
        (kind, held), support = kinds.most_common(1)[0], sum(kinds.values())
        if kind and support >= MIN_SUPPORT and held / support >= MIN_HELD:
            out[tool] = kind
    return out


def learn_stable(calls: Iterable[Any], budget: list[int] | None = None) -> dict[str, Stable]:
    """The tools whose JSON replies (objects or lists) to the same arguments repeated in `MIN_HELD` of at least
    `MIN_SUPPORT` logged repeats (in log order), each with its latest logged replies (bounded; `budget`: the
    bytes left for them, taken from as they are kept)."""
    budget = budget if budget is not None else [MAX_LOGGED_BYTES]
    latest: dict[str, dict[str, Any]] = {}
    asked: dict[str, Counter[str]] = defaultdict(Counter)
    repeats: dict[str, list[int]] = {}
    for call, reply, arguments in _successes(calls):
        key = canonical(arguments)
        replies = latest.setdefault(call.tool, {})
        if key in replies:
            seen = repeats.setdefault(call.tool, [0, 0])
            seen[0] += replies[key] == reply
            seen[1] += 1
        replies[key] = reply
        asked[call.tool][key] += 1
    out: dict[str, Stable] = {}
    for tool, (held, support) in sorted(repeats.items()):
        if support >= MIN_SUPPORT and held / support >= MIN_HELD:
            kept = _bounded(latest[tool], asked[tool], budget)
            if kept:
                out[tool] = Stable(support, round(held / support, 4), kept)
    return out


@dataclass(frozen=True)
class Lookup:
    """Fields of a tool's reply that repeated for the same value of the argument `key` (`ALL`: the same
    arguments): `held` maps each field to (share held, repeats); `values` the latest logged values of those
    fields for each value of the key seen (canonical JSON of the value)."""

    key: str
    held: dict[str, tuple[float, int]]
    values: dict[str, dict[str, Any]]

    def fields(self, arguments: Any) -> dict[str, Any]:
        """The logged fields for this call's value of the key (none where the log never saw it)."""
        if not isinstance(arguments, dict):
            return {}
        if self.key == ALL:
            return self.values.get(canonical(arguments), {})
        if self.key not in arguments or isinstance(arguments[self.key], (dict, list)):
            return {}
        return self.values.get(canonical(arguments[self.key]), {})

    def words(self) -> str:
        given = "the same arguments" if self.key == ALL else f"the same {self.key}"
        kinds = sorted({_INDEX.sub("[]", p) for p in self.held})
        shown = ", ".join(kinds[:6]) + (f" and {len(kinds) - 6} more" if len(kinds) > 6 else "")
        return (f"{shown} = the logged value for {given} (each held in ≥ {MIN_HELD:.0%} of ≥ {MIN_SUPPORT} "
                f"repeats; {len(self.values)} kept)")


def _keys(arguments: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, its value as canonical JSON) of a call: all its arguments, then each plain one alone."""
    return [(ALL, canonical(arguments)), *((name, canonical(value)) for name, value in arguments.items()
                                            if not isinstance(value, (dict, list)))]


def _plain(reply: Any) -> dict[str, Any]:
    """The plain leaf fields of a reply a lookup may hold: under `MAX_PATH` characters, no list index past
    `MAX_INDEX`, and none under a key that a path cannot spell (one with `.`, `[` or `]`)."""
    out: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [("", reply)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{path}.{k}" if path else k, v) for k, v in value.items()
                      if isinstance(k, str) and _KEY.fullmatch(k)]
        elif isinstance(value, list):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(value[:MAX_INDEX + 1])]
        elif path and len(path) <= MAX_PATH:
            out[path] = value
    return out


def learn_lookups(calls: Iterable[Any], stable: Iterable[str] = (), budget: list[int] | None = None
                  ) -> dict[str, list[Lookup]]:
    """Each tool's lookups (tools in `stable`, whose whole reply is logged, need none): per key, the fields
    that repeated in `MIN_HELD` of at least `MIN_SUPPORT` repeats of that key's value — a field one reply has
    and the other lacks counts as not held —, with the latest values of those fields for each value seen
    (bounded). A lookup by all arguments that a lookup by one says no less about is left out."""
    budget = budget if budget is not None else [MAX_LOGGED_BYTES]
    latest: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    asked: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    tally: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(dict)
    skip = set(stable)
    for call, reply, arguments in _successes(calls):
        if call.tool in skip:
            continue
        fields = _plain(reply)
        for key, value in _keys(arguments):
            seen = latest.setdefault((call.tool, key), {})
            before = seen.get(value)
            if before is not None:
                counts = tally[(call.tool, key)]
                for path in before.keys() | fields.keys():
                    count = counts.setdefault(path, [0, 0])
                    count[0] += path in before and path in fields and same_value(before[path], fields[path])
                    count[1] += 1
            seen[value] = fields
            asked[(call.tool, key)][value] += 1
    found: dict[tuple[str, str], dict[str, tuple[float, int]]] = {}
    for (tool, key), counts in sorted(tally.items()):
        held = {path: (round(h / n, 4), n) for path, (h, n) in sorted(counts.items())
                if n >= MIN_SUPPORT and h / n >= MIN_HELD}
        if held:
            found[(tool, key)] = dict(sorted(held.items(), key=lambda item: _order(item[0]))[:MAX_PATHS])
    out: dict[str, list[Lookup]] = {}
    for (tool, key), held in found.items():
        if key == ALL and any(t == tool and k != ALL and held.keys() <= other.keys()
                              and len(latest[(t, k)]) == len(latest[(tool, key)]) for (t, k), other in found.items()):
            continue  # the same calls told apart by one argument: that lookup says it all
        logged = {value: {p: v for p, v in fields.items() if p in held}
                  for value, fields in latest[(tool, key)].items()}
        if not _telling(logged):
            continue  # every field it holds is the key's own value, or one value whatever the key
        if len(out.get(tool, [])) == MAX_LOOKUPS or not _take(budget, held):
            continue
        kept = _bounded({v: f for v, f in logged.items() if f}, asked[(tool, key)], budget)
        if kept:
            out.setdefault(tool, []).append(Lookup(key, held, kept))
    return out


def _telling(logged: dict[str, dict[str, Any]]) -> bool:
    """Whether some field of the logged values (key value -> fields) tells more than the call does: it takes
    more than one value across the key's values, and is not the key's own value (an argument's, for `ALL`)."""
    keyed = [(json.loads(value), fields) for value, fields in logged.items()]
    for path in {p for _, fields in keyed for p in fields}:
        seen = [(k, fields[path]) for k, fields in keyed if path in fields]
        if len({canonical(v) for _, v in seen}) < 2:
            continue
        if not all(same_value(v, k) or isinstance(k, dict) and any(same_value(v, a) for a in k.values())
                   for k, v in seen):
            return True
    return False


def _order(path: str) -> list[tuple[int, int | str]]:
    """A path's sort key: list indices in number order (`items[2]` before `items[10]`)."""
    return [(0, int(index)) if index else (1, name) for index, name in _PART.findall(path)]


def _take(budget: list[int], value: Any) -> bool:
    """Take `value`'s size as JSON from `budget[0]`, where it fits."""
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size > budget[0]:
        return False
    budget[0] -= size
    return True


def _bounded(replies: dict[str, Any], asked: Counter[str], budget: list[int]) -> dict[str, Any]:
    """The most asked of `replies`, each at most `MAX_REPLY_BYTES` as JSON, at most `MAX_REPLIES` of them,
    within `budget[0]` bytes (taken from it)."""
    kept: dict[str, Any] = {}
    for key, _ in asked.most_common():
        if len(kept) == MAX_REPLIES:
            break
        if key not in replies:
            continue
        size = len(json.dumps(replies[key], ensure_ascii=False).encode()) + len(key.encode())
        if size <= MAX_REPLY_BYTES and size <= budget[0]:
            kept[key] = replies[key]
            budget[0] -= size
    return kept


def fill(result: Any, lookups: Iterable[Lookup], arguments: Any) -> tuple[Any, list[str]]:
    """`result` (changed in place, or a new list where a cut rehearsal left an empty object and the reply is
    a list) with every field its tool's lookups know for these arguments — the lookup by all arguments before
    those by one —, adding list elements the model did not write; and the fields set, their indices as `[]`."""
    found: dict[str, Any] = {}
    for lookup in sorted(lookups, key=lambda lookup: lookup.key != ALL):
        for path, value in lookup.fields(arguments).items():
            found.setdefault(path, value)
    if result == {} and found and all(p.startswith("[") for p in found):
        result = []
    made = [MAX_MADE]  # in list order, so an element is made only next to one before it: no gaps
    copied = {_INDEX.sub("[]", p) for p, v in sorted(found.items(), key=lambda item: _order(item[0]))
              if _put(result, _parts(p), v, made)}
    return result, sorted(copied)


def _parts(path: str) -> list[int | str]:
    return [int(index) if index else name for index, name in _PART.findall(path)]


def _put(node: Any, parts: list[int | str], value: Any, made: list[int]) -> bool:
    """Set `parts` of `node` to `value`, making the objects and list elements on the way (a value the model
    wrote where an object or list belongs is replaced; a list grows only by its next element, `made[0]` of
    them and of the objects at most); False where the root is of the other kind, or it cannot be made."""
    part, rest = parts[0], parts[1:]
    if isinstance(part, int):
        if not isinstance(node, list) or part > min(len(node), MAX_INDEX):
            return False
        if part == len(node):
            if made[0] <= 0:
                return False
            made[0] -= 1
            node.append(None)
    elif not isinstance(node, dict):
        return False
    if not rest:
        node[part] = value
        return True
    kind = list if isinstance(rest[0], int) else dict
    current = node[part] if isinstance(node, list) else node.get(part)
    if not isinstance(current, kind):
        if made[0] <= 0:
            return False
        made[0] -= 1
        node[part] = kind()
    return _put(node[part], rest, value, made)


def read_stable(data: Any) -> Stable | None:
    """A rules file's `stable` entry; None where it is not well formed."""
    if not _counted(data):
        return None
    replies = data.get("replies")
    kept = {canonical(pair[0]): pair[1] for pair in (replies if isinstance(replies, list) else [])[:MAX_REPLIES]
            if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], dict)
            and isinstance(pair[1], (dict, list))}
    return Stable(data["support"], float(data["held"]), kept) if kept else None


def write_lookup(lookup: Lookup) -> dict[str, Any]:
    return {"key": lookup.key, "held": {p: list(h) for p, h in lookup.held.items()},
            "values": [[json.loads(v), fields] for v, fields in lookup.values.items()]}


def read_lookups(data: Any) -> list[Lookup] | None:
    """A rules file's `lookups` entry (a list of `write_lookup`s); None where none is well formed."""
    out = [found for found in map(_lookup, data[:MAX_LOOKUPS] if isinstance(data, list) else []) if found is not None]
    return out or None


def _lookup(data: Any) -> Lookup | None:
    if not isinstance(data, dict) or not isinstance(data.get("key"), str) or not 0 < len(data["key"]) <= 200:
        return None
    held = data.get("held")
    held = {p: (float(h[0]), h[1]) for p, h in list(held.items())[:MAX_PATHS]
            if _field(p) and _counted({"held": h[0], "support": h[1]} if isinstance(h, list) and len(h) == 2 else None)
            } if isinstance(held, dict) else {}
    values = data.get("values")
    kept: dict[str, dict[str, Any]] = {}
    for pair in (values if isinstance(values, list) else [])[:MAX_REPLIES]:
        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], dict):
            fields = {p: v for p, v in pair[1].items() if p in held and not isinstance(v, (dict, list))}
            if fields:
                kept[canonical(pair[0])] = fields
    return Lookup(data["key"], held, kept) if held and kept else None


def _field(path: Any) -> bool:
    return (isinstance(path, str) and len(path) <= MAX_PATH and _PATH.fullmatch(path) is not None
            and all(int(i) <= MAX_INDEX for i in re.findall(r"\[(\d+)\]", path)))


def _counted(data: Any) -> bool:
    """Whether `data` holds a `support` and a `held` a rule may be read with."""
    if not isinstance(data, dict):
        return False
    support, held = data.get("support"), data.get("held")
    return (isinstance(support, int) and not isinstance(support, bool) and support >= MIN_SUPPORT
            and isinstance(held, (int, float)) and not isinstance(held, bool) and MIN_HELD <= held <= 1)
