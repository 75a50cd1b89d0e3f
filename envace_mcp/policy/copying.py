"""Reply fields a world model copies by rule instead of writing them.

Where a tool's logged replies show a field equal to one of the call's own arguments (a reservation's `sku`),
to the latest earlier value of that field's name in the run (the `item_name` a `get_item` read), or to that
field of what an argument names as the run's earlier replies showed it (the `unit_price` of the item whose
`sku` the call gives: its *state*, `call_facts.state_of`), or to one value whatever the call (a shipment's
`status`, always `"shipped"`) in nearly every call, a rehearsal's predicted result takes that field from the
call, the run or the log, whatever the model wrote there; the rehearsal says which fields it copied
(`Prediction.copied`).

    rules = learn(calls)              # from a fit's training calls: tool -> [CopyRule]
    write_rules(folder, rules, identities)   # copy_rules.json, each tool's rules bound to its identity
    table = read_rules(folder)        # None where the folder has none (or it is unreadable)
    prediction = table.apply(prediction, request)

What the log already answers comes first (`policy.logged`): a tool whose reply to the same arguments was the
same in nearly every logged repeat (a room catalog: `Stable`) is predicted as its logged reply to those
arguments; a field that repeated for the same value of an argument (a room's name given its id: a
`Lookup`) takes its logged value, in list elements the model did not write too.

    write_rules(folder, learn(calls), identities, *learn_replies(calls))   # what `world-model fit` writes

Learned from successful replies only. A field inside a list is one field for every element (`items[].category`:
each listed item's category, where a listing echoes the category it was asked for; `[].origin` where the
reply itself is a list), counted once per element and set in every element the model predicted. A rule
needs `MIN_SUPPORT` values of the field that had a source, and to hold in `MIN_HELD` of them. The file is
read as untrusted input: bounded, and a rule that is not well formed is dropped; a tool whose server or
schemas differ from the ones the rules were learned on gets none (`ToolSpec.behaviour`).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.messages import ToolMessage

from envace_mcp._files import read_bounded
from envace_mcp.policy.call_facts import objects_shown, state_of, text_arguments
from envace_mcp.policy.fidelity import field_name, latest_values, leaves, parsed_json, same_value
from envace_mcp.policy.logged import (
    MIN_HELD,
    MIN_SUPPORT,
    Lookup,
    Stable,
    fill,
    read_lookups,
    read_stable,
    write_lookup,
)
from envace_mcp.policy.prompts import content_text
from envace_mcp.policy.types import Prediction, RehearseRequest

if TYPE_CHECKING:
    from envace_mcp.toolbox.catalog import ToolSpec

RULES_FILE = "copy_rules.json"
MAX_BYTES = 1 << 20
MAX_RULES = 64
"""Rules kept per tool (and read per tool from a file)."""
MAX_CONSTANT = 40
"""Longest value, as JSON, a field is predicted as whatever the call (a status, not a description)."""


@dataclass(frozen=True)
class CopyRule:
    """`field` of a tool's reply (a dotted path outside lists) equals the call's argument `name` (`source`
    "argument", a dotted path), the latest earlier value in the run of the field named `name` ("earlier"),
    the field of that name in the state of what the call's argument `name` names ("state"), or the value
    `name` holds as JSON ("constant")."""

    field: str
    """A dotted path; `[]` after a name stands for every element of that list."""
    source: str
    name: str
    support: int
    held: float

    def value(self, arguments: Any, earlier: dict[str, Any], states: dict[str, dict[str, Any]]) -> tuple[bool, Any]:
        """(whether the source has a value for this call, the value); `states`: each text argument's state."""
        if self.source == "argument":
            found = leaves(arguments).get(self.name, _MISSING) if isinstance(arguments, dict) else _MISSING
        elif self.source == "state":
            found = states.get(self.name, {}).get(field_name(self.field), _MISSING)
        elif self.source == "constant":
            found = json.loads(self.name)
        else:
            found = earlier.get(self.name, _MISSING)
        return found is not _MISSING, found


_MISSING = object()
_ELEMENT = re.compile(r"\[\d+\]")


def learn(calls: Iterable[Any]) -> dict[str, list[CopyRule]]:
    """Copy rules of each tool from real calls (`worldmodel.calls.Observed`: `tool`, `failed`, `value`,
    `request`, `earlier`): per field, the source that held most often, kept where it held in `MIN_HELD` of at
    least `MIN_SUPPORT` replies (on a tie an argument, then a state, then an earlier value, then a constant: a
    plain value of at most `MAX_CONSTANT` characters as JSON)."""
    counts: dict[str, dict[tuple[str, str, str], list[int]]] = {}
    values: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for call in calls:
        if call.failed:
            continue
        reply = parsed_json(call.value)
        if not isinstance(reply, (dict, list)):
            continue
        arguments = call.request.call.arguments
        given = {p: v for p, v in leaves(arguments).items() if "[" not in p} if isinstance(arguments, dict) else {}
        latest = latest_values(call.earlier)
        states = states_of(call.request)
        tally = counts.setdefault(call.tool, {})
        for exact, value in leaves(reply).items():
            if isinstance(value, (dict, list)):
                continue
            path = _ELEMENT.sub("[]", exact)  # every element of a list is one field
            if path.endswith("[]"):
                continue  # a list of plain values: which element is which, no rule says
            for name, source_value in given.items():
                if not isinstance(source_value, (dict, list)):
                    seen = tally.setdefault((path, "argument", name), [0, 0])
                    seen[0] += same_value(value, source_value)
                    seen[1] += 1
            values[(call.tool, path)][json.dumps(value, ensure_ascii=False)] += 1
            key = field_name(path)
            for name, state in states.items():
                if key in state:
                    seen = tally.setdefault((path, "state", name), [0, 0])
                    seen[0] += same_value(value, state[key])
                    seen[1] += 1
            if key in latest and not isinstance(latest[key], (dict, list)):
                seen = tally.setdefault((path, "earlier", key), [0, 0])
                seen[0] += same_value(value, latest[key])
                seen[1] += 1
    for (tool, path), seen in values.items():
        text, held = seen.most_common(1)[0]
        if len(text) <= MAX_CONSTANT:
            counts[tool][(path, "constant", text)] = [held, seen.total()]
    rules: dict[str, list[CopyRule]] = {}
    for tool, tally in sorted(counts.items()):
        best: dict[str, CopyRule] = {}
        for (path, source, name), (held, support) in tally.items():
            if support < MIN_SUPPORT or held / support < MIN_HELD:
                continue
            rule = CopyRule(path, source, name, support, round(held / support, 4))
            current = best.get(path)
            if current is None or _rank(rule) > _rank(current):
                best[path] = rule
        if best:
            rules[tool] = sorted(best.values(), key=lambda r: r.field)[:MAX_RULES]
    return rules


def states_of(request: Any) -> dict[str, dict[str, Any]]:
    """The state of what each of the call's text arguments names, as the run's earlier replies showed it."""
    objects = objects_shown(request)
    return {path: state_of(objects, field_name(path), value) for path, value in text_arguments(request).items()}


def _rank(rule: CopyRule) -> tuple[float, int, int, bool]:
    # the rule that held most often; then an argument (the call itself says it), then the state of what it
    # names, then the latest value of the field's name; then more support; then a source of the field's name
    return (rule.held, ("constant", "earlier", "state", "argument").index(rule.source), rule.support,
            rule.name == field_name(rule.field))


Identity = tuple[str | None, str | None]
"""(server, `ToolSpec.behaviour`): the tool a rule was learned on."""


@dataclass(frozen=True)
class BoundRules:
    """Rules by tool, each tool's bound to the identity it was learned on (a copy or status rules file)."""

    tools: dict[str, tuple[Identity, list[Any]]]

    def for_tool(self, spec: ToolSpec | None) -> list[Any]:
        """The rules of `spec`'s tool, where they were learned on this very tool (server and schemas)."""
        return bound(self.tools, spec) or []


def binds(identity: Identity, spec: ToolSpec) -> bool:
    """Whether what was learned on `identity` (server, behaviour) applies to the tool `spec`."""
    server, behaviour = identity
    return (server or None, behaviour) == (spec.server or None, spec.behaviour)


def bound(entries: dict[str, tuple[Identity, Any]], spec: ToolSpec | None) -> Any:
    """`spec`'s tool's entry in `entries` (tool -> (identity, entry)), where it was learned on this very tool;
    else None."""
    if spec is None or spec.name not in entries:
        return None
    identity, entry = entries[spec.name]
    return entry if binds(identity, spec) else None


@dataclass(frozen=True)
class RuleTable(BoundRules):
    """Copy rules by tool, each tool's bound to the (server, behaviour) it was learned on."""

    source: str | None = None
    stable: dict[str, tuple[Identity, Stable]] = field(default_factory=dict)
    """Tools predicted as their logged reply to the same arguments, each bound to its identity."""
    lookups: dict[str, tuple[Identity, list[Lookup]]] = field(default_factory=dict)
    """Each tool's fields taken from the logged reply to the same value of an argument, bound likewise."""
    kinds: dict[str, tuple[Identity, str]] = field(default_factory=dict)
    """Each tool's kind of JSON reply, "object" or "array", where its log showed one (`logged.learn_kinds`)."""

    def kind_summary(self) -> dict[str, str]:
        """Each tool's kind of reply in words, as a report states it (a hold, not a rule that sets a field)."""
        return {tool: f"a JSON {kind}, as {MIN_HELD:.0%} or more of its logged successes were"
                for tool, (_, kind) in sorted(self.kinds.items())}

    def reply_kind(self, spec: ToolSpec | None) -> str | None:
        """The kind of JSON ("object" or "array") a rehearsal of `spec`'s tool is held to where it declares no
        `outputSchema`: the kind its logged replies were; None where the log showed none."""
        return bound(self.kinds, spec)

    def summary(self) -> dict[str, list[str]]:
        """Each tool's rules in words, as a report states them (the kinds apart: `kind_summary`)."""
        source = {"argument": "argument {}", "earlier": "latest earlier {}", "state": "that of what {} names, as shown",
                  "constant": "{} whatever the call"}
        words = {tool: [f"{r.field} = {source[r.source].format(r.name)} (held in {r.held:.0%} of {r.support})"
                        for r in rules]
                 for tool, (_, rules) in self.tools.items()}
        for tool, (_, found) in self.stable.items():
            words.setdefault(tool, []).insert(0, f"the whole reply = the logged reply to the same arguments "
                                                 f"(held in {found.held:.0%} of {found.support} repeats; "
                                                 f"{len(found.replies)} kept)")
        for tool, (_, lookups) in self.lookups.items():
            words.setdefault(tool, [])[:0] = [lookup.words() for lookup in lookups]
        return dict(sorted(words.items()))

    def apply(self, prediction: Prediction, request: RehearseRequest) -> Prediction:
        """`prediction` with its result's fields set by what the log answers for this call (the whole logged
        reply of a stable tool; else the fields its lookups know, making the objects and list elements they
        sit in) and by the copy rules of the rehearsed tool where their source has a value (a field is set only
        where its parent object was predicted); a result cut at its budget before anything of it parsed counts
        as an empty object. An error or an unreadable rehearsal, or a result that is neither an object nor a
        list, is returned as it is."""
        given = prediction
        if prediction.status == "result" and prediction.partial and prediction.result is None:
            prediction = prediction.model_copy(update={"result": {}})
        if prediction.status != "result" or not isinstance(prediction.result, (dict, list)):
            return given
        found = bound(self.stable, request.tool)
        logged = found.reply(request.call.arguments) if found is not None else None
        if logged is not None:
            copied = sorted(logged) if isinstance(logged, dict) else ["[]"]  # a list: the whole of it
            return prediction.model_copy(update={"result": json.loads(json.dumps(logged)), "copied": copied})
        rules, lookups = self.for_tool(request.tool), bound(self.lookups, request.tool) or []
        if not rules and not lookups:
            return given
        earlier = latest_values(content_text(m.content) for m in request.history if isinstance(m, ToolMessage))
        result, copied = fill(json.loads(json.dumps(prediction.result)), lookups, request.call.arguments)
        states = states_of(request) if any(rule.source == "state" for rule in rules) else {}
        for rule in rules:
            found, value = rule.value(request.call.arguments, earlier, states)
            if found and _set(result, rule.field, value) and rule.field not in copied:
                copied.append(rule.field)
        if not copied:
            return given
        return prediction.model_copy(update={"result": result, "copied": copied})


def _set(obj: Any, path: str, value: Any) -> bool:
    """Set `path` (its `[]` parts: in every element of that list; a leading `[]`: in every element of a
    reply that is a list) where its parent objects were predicted; whether anything was set."""
    part, _, rest = path.partition(".")
    if not part.endswith("[]"):
        if not isinstance(obj, dict) or rest and part not in obj:
            return False
        if not rest:
            obj[part] = value
            return True
        return _set(obj[part], rest, value)
    name = part[:-2]
    items = obj if not name else obj.get(name) if isinstance(obj, dict) else None
    if not isinstance(items, list) or not rest:
        return False  # no such list predicted; or a list of plain values: which element is which, no rule says
    found = False
    for item in items:
        found = _set(item, rest, value) or found
    return found


def write_bound(path: Path, rules: dict[str, list[Any]], identities: dict[str, Identity],
                per_tool: dict[str, dict[str, Any]] | None = None, indent: int | None = 1, **extra: Any) -> Path:
    """A rules file: each tool's rules (dataclasses) with the identity they were learned on and its entry in
    `per_tool`, and `extra`; `indent=None`: compact, as long as the sizes its entries were budgeted at."""
    data = {"tools": {tool: {"server": identities.get(tool, (None, None))[0],
                             "behaviour": identities.get(tool, (None, None))[1],
                             "rules": [asdict(r) for r in found], **(per_tool or {}).get(tool, {})}
                      for tool, found in rules.items()}, **extra}
    path.write_text(json.dumps(data, indent=indent, ensure_ascii=False) + "\n")
    return path


def read_bound(path: Path, max_bytes: int, max_rules: int, rule: Callable[[Any], Any]
               ) -> tuple[dict[str, tuple[Identity, list[Any]]], dict[str, Any]] | None:
    """(each tool's well-formed rules with its identity, the whole file) of a rules file; None where there is
    none, or it is too large or not a JSON object of tools. `rule` reads one rule (None: not well formed,
    dropped); a tool bound to no identity gets none."""
    text = read_bounded(path, max_bytes)
    try:
        data = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        return None
    tools = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(tools, dict):
        return None
    table: dict[str, tuple[Identity, list[Any]]] = {}
    for tool, entry in tools.items():
        if not isinstance(tool, str) or not isinstance(entry, dict) or not isinstance(entry.get("rules"), list):
            continue
        server, behaviour = entry.get("server"), entry.get("behaviour")
        if not isinstance(server, (str, type(None))) or not isinstance(behaviour, str):
            continue  # bound to no tool: applies to none
        rules = [r for r in map(rule, entry["rules"][:max_rules]) if r is not None]
        if rules:
            table[tool] = ((server, behaviour), rules)
    return table, data


def read_extra(tools: dict[Any, Any], key: str, parse: Callable[[Any], Any]) -> dict[str, tuple[Identity, Any]]:
    """Each tool's extra entry `key` of a rules file's `tools` (`write_bound`'s `per_tool`), read by `parse`
    (None: not well formed, dropped), with the identity it was learned on; a tool bound to none gets none."""
    out: dict[str, tuple[Identity, Any]] = {}
    for tool, entry in tools.items():
        if not isinstance(tool, str) or not isinstance(entry, dict):
            continue
        value, server, behaviour = parse(entry.get(key)), entry.get("server"), entry.get("behaviour")
        if value is not None and isinstance(server, (str, type(None))) and isinstance(behaviour, str):
            out[tool] = ((server, behaviour), value)
    return out


def write_rules(folder: str | Path, rules: dict[str, list[CopyRule]], identities: dict[str, Identity],
                stable: dict[str, Stable] | None = None, lookups: dict[str, list[Lookup]] | None = None,
                kinds: dict[str, str] | None = None) -> Path:
    """`copy_rules.json` in `folder`: each tool's rules, its logged replies where it is `stable`, its
    `lookups` and the kind of JSON it replies, with the (server, behaviour) they were learned on."""
    stable, lookups, kinds = stable or {}, lookups or {}, kinds or {}
    every = {tool: rules.get(tool, []) for tool in sorted({*rules, *stable, *lookups, *kinds})}
    extra: dict[str, dict[str, Any]] = {tool: {"stable": {"support": s.support, "held": s.held,
                                                          "replies": [[json.loads(k), v] for k, v in s.replies.items()]}}
                                        for tool, s in stable.items()}
    for tool, found in lookups.items():
        extra.setdefault(tool, {})["lookups"] = [write_lookup(lookup) for lookup in found]
    for tool, kind in kinds.items():
        extra.setdefault(tool, {})["kind"] = kind
    path = write_bound(Path(folder) / RULES_FILE, every, identities, extra, indent=None)
    if path.stat().st_size > MAX_BYTES:  # past what `read_rules` reads: keep the rules and kinds at least
        path = write_bound(path, {tool: rules.get(tool, []) for tool in sorted({*rules, *kinds})}, identities,
                           {tool: {"kind": kind} for tool, kind in kinds.items()})
    return path


def read_rules(folder: str | Path | None) -> RuleTable | None:
    """A folder's copy rules; None where it has none, or the file is too large or not JSON. Rules that are
    not well formed are dropped one by one."""
    if folder is None:
        return None
    path = Path(folder) / RULES_FILE
    read = read_bound(path, MAX_BYTES, MAX_RULES, _rule)
    if read is None:
        return None
    table, data = read
    return RuleTable(table, source=str(path), stable=read_extra(data["tools"], "stable", read_stable),
                     lookups=read_extra(data["tools"], "lookups", read_lookups),
                     kinds=read_extra(data["tools"], "kind", lambda k: k if k in ("object", "array") else None))


def _rule(data: Any) -> CopyRule | None:
    if not isinstance(data, dict):
        return None
    field, source, name = data.get("field"), data.get("source"), data.get("name")
    support, held = data.get("support"), data.get("held")
    if not (isinstance(field, str) and isinstance(name, str) and source in ("argument", "earlier", "state", "constant")
            and 0 < len(field) <= 200 and 0 < len(name) <= 200 and "[" not in field.replace("[].", ".")
            and isinstance(support, int) and not isinstance(support, bool) and support >= MIN_SUPPORT
            and isinstance(held, (int, float)) and not isinstance(held, bool) and MIN_HELD <= held <= 1):
        return None
    if source == "constant" and not _plain_json(name):
        return None
    return CopyRule(field, source, name, support, float(held))


def _plain_json(text: str) -> bool:
    """Whether `text` is a plain JSON value (not an object or a list) of at most `MAX_CONSTANT` characters."""
    try:
        return len(text) <= MAX_CONSTANT and not isinstance(json.loads(text), (dict, list))
    except (ValueError, RecursionError):
        return False
