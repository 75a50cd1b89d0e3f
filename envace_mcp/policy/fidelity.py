"""How well a rehearsal predicted reality: a pure comparison of a prediction with a real result."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from envace_mcp.policy.types import Prediction
from envace_mcp.toolbox import ToolResult


@dataclass(frozen=True)
class Match:
    """`score` in [0, 1]: 1 when the prediction matches the real outcome field for field."""

    score: float
    status_match: bool
    fields: int = 0
    """Leaf fields of the real result that were compared."""
    matched: int = 0
    mismatches: list[str] = field(default_factory=list)


def leaves(value: Any, path: str = "") -> dict[str, Any]:
    """Flatten JSON into `{"a.b[0].c": leaf}`."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(leaves(sub, f"{path}.{key}" if path else str(key)))
        return out or {path: {}}
    if isinstance(value, list):
        out = {}
        for i, sub in enumerate(value):
            out.update(leaves(sub, f"{path}[{i}]"))
        return out or {path: []}
    return {path: value}


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) <= max(0.005, 1e-6 * abs(float(b)))
    return a == b


def compare(prediction: Prediction, real: ToolResult) -> Match:
    """Score a rehearsal against what the server really returned.

    An error predicted for an error (or a result for a result) is a status match; a predicted
    result scores the fraction of the real result's leaf fields it got right. An invalid
    rehearsal or a status mismatch scores 0.
    """
    if prediction.status == "invalid":
        return Match(score=0.0, status_match=False, mismatches=[f"invalid rehearsal: {prediction.code}"])
    if real.is_error:
        ok = prediction.status == "tool_error"
        return Match(score=1.0 if ok else 0.0, status_match=ok,
                     mismatches=[] if ok else ["predicted a result, the tool failed"])
    if prediction.status == "tool_error":
        return Match(score=0.0, status_match=False, mismatches=["predicted an error, the tool succeeded"])
    truth, guess = leaves(parsed_json(real.value)), leaves(prediction.result)
    mismatches = [p for p, v in truth.items() if p not in guess or not same_value(guess[p], v)]
    matched = len(truth) - len(mismatches)
    return Match(score=matched / len(truth) if truth else 1.0, status_match=True, fields=len(truth),
                 matched=matched, mismatches=mismatches[:20])


def field_name(path: str) -> str:
    """A leaf path's last key, list indices dropped (`items[2].price` -> `price`)."""
    return path.rsplit(".", 1)[-1].split("[", 1)[0]


def field_split(predicted: Any, real: Any, arguments: Any, earlier: Iterable[Any] = ()) -> dict[str, int]:
    """A successful real result's leaf fields in three kinds, with how many a predicted result got right:

    - `echoed`: the value is one of the call's own argument values (the ids, names, amounts it was given);
    - `seen`: an earlier real result of the run had a field of the same name with this value (an order's
      items read before it is cancelled): the world model can copy it from the conversation;
    - `new`: neither: the environment computed or made it (new balances, a changed status, a fresh id).

    `predicted=None` (an invalid rehearsal, or an error predicted for a success) gets none right. The keys
    are stored in saved results; what people read calls `seen` *read* and `new` *computed*."""
    return _split(leaves(predicted) if predicted is not None else {}, real, arguments, earlier)


def copy_split(real: Any, arguments: Any, earlier: Iterable[Any] = ()) -> dict[str, int]:
    """`field_split` of the trivial predictor, the floor of every field figure: each field of the real
    reply guessed as the call's argument of the same name, else as the latest earlier observation's field
    of that name (no guess where neither has one)."""
    named = {field_name(p): v for p, v in leaves(arguments).items()} if isinstance(arguments, (dict, list)) else {}
    latest = latest_values(earlier)
    guess = {}
    for path in leaves(parsed_json(real)):
        key = field_name(path)
        if key in named or key in latest:
            guess[path] = named[key] if key in named else latest[key]
    return _split(guess, real, arguments, earlier)


def misses(predicted: Any, real: Any, limit: int = 20, longest: int = 200) -> dict[str, list[str]]:
    """The leaf fields of a successful real result a predicted result got wrong, by path: `absent` (the
    prediction has no such field: a listing's element it left out) and `wrong` (another value); at most
    `limit` of each, paths cut to `longest` characters. `predicted=None`: every field absent."""
    guess = leaves(predicted) if predicted is not None else {}
    out: dict[str, list[str]] = {"absent": [], "wrong": []}
    for path, value in leaves(parsed_json(real)).items():
        kind = "absent" if path not in guess else "wrong" if not same_value(guess[path], value) else None
        if kind is not None and len(out[kind]) < limit:
            out[kind].append(path[:longest])
    return out


def latest_values(earlier: Iterable[Any]) -> dict[str, Any]:
    """Each field name's latest value in a run's earlier replies (in the run's order: the latest wins)."""
    latest: dict[str, Any] = {}
    for value in earlier:
        for path, leaf in leaves(parsed_json(value)).items():
            latest[field_name(path)] = leaf
    return latest


def _split(guess: dict[str, Any], real: Any, arguments: Any, earlier: Iterable[Any]) -> dict[str, int]:
    given = [v for v in (leaves(arguments).values() if isinstance(arguments, (dict, list)) else [arguments])
             if not isinstance(v, (dict, list))]
    shown: dict[str, list[Any]] = {}
    for value in earlier:
        for path, leaf in leaves(parsed_json(value)).items():
            shown.setdefault(field_name(path), []).append(leaf)
    out = {"echoed": 0, "echoed_ok": 0, "seen": 0, "seen_ok": 0, "new": 0, "new_ok": 0}
    for path, value in leaves(parsed_json(real)).items():
        kind = ("echoed" if any(same_value(value, g) for g in given)
                else "seen" if any(same_value(value, v) for v in shown.get(field_name(path), ())) else "new")
        out[kind] += 1
        out[f"{kind}_ok"] += int(path in guess and same_value(guess[path], value))
    return out


def parsed_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # not JSON, or nested past what Python can read
            pass
    return value
