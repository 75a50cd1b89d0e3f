"""Argument validation against a tool's input schema, before any server sees the call, and the same
checks for any JSON value against an output schema (2026-07-28: `structuredContent` may be any JSON
value, and an output schema any JSON Schema).

Schemas are JSON Schema 2020-12 unless their `$schema` names another draft (a draft-07 one is
validated as draft-07: `definitions`, tuple `items`, `dependencies`).

Schemas come from servers and are untrusted. Nothing in one may cause network or file access, or
unbounded work:
- `$ref` is resolved only inside the schema itself (a JSON pointer or an `$anchor`); a remote,
  `file:` or dangling reference, or a cycle of references that never descends into the instance
  (`{"$ref": "#"}`), makes the tool's schema *unusable*: every call to it is refused with that reason
  (`ArgumentValidator.refusal`), and the toolbox reports it when it opens;
- `pattern` and `patternProperties` run on a backtracking engine with a time limit per match and per
  call (`PATTERN_MATCH_S`, `VALIDATION_BUDGET_S`): a catastrophic pattern fails the argument it was
  checking, quickly, instead of stalling the event loop every run shares; `uniqueItems` is checked in
  one pass, not pair by pair.
"""

from __future__ import annotations

import contextvars
import functools
import json
import reprlib
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import regex
from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend, validator_for
from referencing import Registry
from referencing.exceptions import NoSuchResource

PATTERN_MATCH_S = 0.02
"""One regular-expression match: real patterns take microseconds; catastrophic ones take seconds."""
VALIDATION_BUDGET_S = 0.1
"""All the pattern matching of one call's arguments."""

_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("envace_validation_deadline", default=0.0)
_SAME_INSTANCE = ("allOf", "anyOf", "oneOf")
"""Applicators whose subschemas apply to the same instance (with `$ref`, `not`, `if`/`then`/`else`,
`dependentSchemas`): a cycle through them alone never ends."""


def field_path(error: ValidationError) -> str:
    """A readable path to the offending field: `items[0].qty`; the missing name for `required`."""
    parts: list[str] = []
    for part in error.absolute_path:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + str(part))
    path = "".join(parts)
    if error.validator == "required" and isinstance(error.instance, Mapping):
        # one error per missing name, each holding the whole `required` list: the message says which
        missing = [name for name in error.validator_value if name not in error.instance]
        named = next((name for name in missing if error.message == f"{name!r} is a required property"),
                     missing[0] if missing else None)
        if named is not None:
            path = f"{path}.{named}" if path else str(named)
    elif error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        allowed = set((error.schema.get("properties") or {}).keys())
        extra = [name for name in error.instance if name not in allowed]
        if extra:
            path = f"{path}.{extra[0]}" if path else str(extra[0])
    return path


class SchemaValidator:
    """A compiled JSON Schema validator for any JSON value (a tool's structured content, say).

    The validator class follows the schema's `$schema` (Draft 2020-12 when absent, as MCP specifies).
    A schema that is invalid JSON Schema is reported once (`schema_error`) and values are let through
    (the server is the authority on its own schema); an *unsafe* one (see the module docstring) is
    refused (`refusal`), since validating it would fetch, read or recurse without end.
    """

    what = "output schema"
    """What the schema is, in messages."""

    def __init__(self, schema: Mapping[str, Any] | None) -> None:
        self.schema = dict(schema if schema is not None else {})
        self.schema_error: str | None = None
        self.refusal: str | None = unsafe_references(self.schema)
        self._validator: Any = None
        self._checked: dict[str, list[dict[str, str]]] = {}
        """Violations found per arguments (their sorted JSON), at most 256 kept."""
        if self.refusal is not None:
            return
        cls = validator_for(self.schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(self.schema)
        except jsonschema.SchemaError as exc:
            self.schema_error = exc.message
            return
        except Exception as exc:  # noqa: BLE001 - a schema that breaks the meta-schema check is unusable
            self.refusal = f"cannot be read ({type(exc).__name__}: {str(exc)[:200]})"
            return
        bounded = _bounded(cls)
        self._validator = bounded(self.schema, registry=_NO_RETRIEVAL, format_checker=cls.FORMAT_CHECKER)

    def errors(self, value: Any) -> list[dict[str, str]]:
        """Every violation as `{"field", "message"}`, most relevant first; empty when valid."""
        if self.refusal is not None:
            return [{"field": "", "message": f"the tool's {self.what} {self.refusal}; the call is refused"}]
        if self._validator is None:
            return []
        try:  # one call is checked by the gate, again before it runs, and by the toolbox: validate it once
            key = json.dumps(value, sort_keys=True)
        except (TypeError, ValueError):
            key = None
        if key is not None and key in self._checked:
            return [dict(e) for e in self._checked[key]]
        found = self._errors(value)
        if key is not None:
            if len(self._checked) >= 256:
                self._checked.clear()
            self._checked[key] = found
        return [dict(e) for e in found]

    def _errors(self, value: Any) -> list[dict[str, str]]:
        token = _deadline.set(time.monotonic() + VALIDATION_BUDGET_S)
        try:
            found = sorted(self._validator.iter_errors(value), key=jsonschema.exceptions.relevance, reverse=True)
        except Exception as exc:  # noqa: BLE001 - a schema that defeats the validator is the server's fault, as data
            return [{"field": "", "message": f"the tool's {self.what} cannot be checked ({type(exc).__name__}: "
                                             f"{str(exc)[:200]}); the call is refused"}]
        finally:
            _deadline.reset(token)
        return [{"field": field_path(e), "message": e.message} for e in found]


class ArgumentValidator(SchemaValidator):
    """A `SchemaValidator` for one tool's arguments, which MCP requires to be a JSON object."""

    what = "input schema"

    def __init__(self, schema: Mapping[str, Any] | None) -> None:
        super().__init__(schema or {"type": "object"})

    def errors(self, value: Any) -> list[dict[str, str]]:
        if self.refusal is None and self._validator is not None and not isinstance(value, Mapping):
            return [{"field": "", "message": f"arguments must be a JSON object, got {type(value).__name__}"}]
        return super().errors(dict(value) if isinstance(value, Mapping) else value)


# ---------------------------------------------------------------------------- references


def _refuse_retrieval(uri: str) -> Any:
    raise NoSuchResource(ref=uri)


_NO_RETRIEVAL: Registry[Any] = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]
"""Passing a registry also turns off jsonschema's deprecated fetching of remote `$ref`s."""


def _nodes(schema: Any) -> Iterator[Any]:
    """Every dict and list in a schema, iteratively (a deeply nested schema must not recurse)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            yield node
            stack.extend(v for v in node.values() if isinstance(v, (Mapping, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (Mapping, list)))


def _resolve(root: Mapping[str, Any], ref: str, anchors: Mapping[str, Any]) -> Any:
    """The subschema a `#...` reference names inside `root`, or `None`."""
    fragment = urllib.parse.unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        return anchors.get(fragment)
    node: Any = root
    for raw in fragment.split("/")[1:]:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _same_instance(node: Mapping[str, Any], root: Mapping[str, Any], anchors: Mapping[str, Any]) -> list[Any]:
    """The subschemas that apply to the same instance as `node` (the edges a cycle would run along)."""
    out: list[Any] = []
    for key in ("$ref", "$dynamicRef", "$recursiveRef"):
        if isinstance(node.get(key), str):
            out.append(_resolve(root, node[key], anchors))
    for key in _SAME_INSTANCE:
        if isinstance(node.get(key), list):
            out.extend(node[key])
    for key in ("not", "if", "then", "else"):
        if isinstance(node.get(key), Mapping):
            out.append(node[key])
    if isinstance(node.get("dependentSchemas"), Mapping):
        out.extend(node["dependentSchemas"].values())
    return [s for s in out if isinstance(s, Mapping)]


def unsafe_references(schema: Mapping[str, Any]) -> str | None:
    """Why `schema` cannot be validated safely (a reference leaving it, dangling, or a cycle), or `None`."""
    nodes = list(_nodes(schema))
    anchors = {n["$anchor"]: n for n in nodes if isinstance(n.get("$anchor"), str)}
    anchors |= {n["$dynamicAnchor"]: n for n in nodes if isinstance(n.get("$dynamicAnchor"), str)}
    for node in nodes:
        for key in ("$ref", "$dynamicRef", "$recursiveRef"):
            if key not in node:
                continue
            ref = node[key]
            if not isinstance(ref, str):
                return f"has a {key} that is not a string ({ref!r:.60})"
            if not ref.startswith("#"):
                return f"refers outside itself ({key} {ref!r:.120}); only references inside the schema are followed"
            if _resolve(schema, ref, anchors) is None:
                return f"has a dangling {key} {ref!r:.120}"
    # a cycle along same-instance edges: validation would recurse forever (iterative DFS, colours by id)
    state: dict[int, int] = {}
    for start in nodes:
        if state.get(id(start)):
            continue
        stack: list[tuple[Any, Iterator[Any]]] = [(start, iter(_same_instance(start, schema, anchors)))]
        state[id(start)] = 1
        while stack:
            node, edges = stack[-1]
            step = next(edges, None)
            if step is None:
                state[id(node)] = 2
                stack.pop()
            elif state.get(id(step)) == 1:
                return "has a cycle of references that never reaches a value ($ref to itself or around a loop)"
            elif not state.get(id(step)):
                state[id(step)] = 1
                stack.append((step, iter(_same_instance(step, schema, anchors))))
    return None


# ---------------------------------------------------------------------------- patterns


@functools.lru_cache(maxsize=512)
def _compile(pattern: str) -> Any:
    return regex.compile(pattern)


def _search(pattern: str, text: str) -> bool | ValidationError:
    """Whether `pattern` matches somewhere in `text`, or the error to report when that cannot be decided
    (not a regular expression, or not in time)."""
    left = _deadline.get() - time.monotonic()
    try:
        if left > 0:
            return _compile(pattern).search(text, timeout=min(PATTERN_MATCH_S, left)) is not None
    except regex.error:
        return ValidationError(f"the schema's pattern {pattern[:80]!r} is not a regular expression")
    except TimeoutError:
        pass
    return ValidationError(f"{text[:40]!r} could not be checked against the pattern {pattern[:80]!r} in time "
                           f"(a pattern that slow is refused)")


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    found = _search(pattern, instance)
    if isinstance(found, ValidationError):
        yield found
    elif not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """`uniqueItems` in one pass over the items' canonical JSON (jsonschema compares every pair: 3,000
    small objects held the event loop for 11 s). Equal as JSON Schema counts equality: 1 and 1.0 are
    the same, true and 1 are not, key order does not matter."""
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[str] = set()
    for item in instance:
        try:
            key = json.dumps(_canonical(item), sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            yield ValidationError("items cannot be compared (nested too deep or not JSON)")
            return
        if key in seen:
            yield ValidationError(f"{reprlib.repr(item)} appears more than once; items must be unique")
            return
        seen.add(key)


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return ["n", int(value) if abs(value) < 2**63 and float(value).is_integer() else value]  # 10**400: no float
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return repr(value)


def _pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            found = _search(pattern, key)
            if isinstance(found, ValidationError):
                yield found
                return
            if found:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


@functools.cache
def _bounded(cls: Any) -> Any:
    """`cls` (a draft's validator class) with time-bounded pattern keywords; one class per draft, shared
    by every tool (`extend` builds a new class)."""
    plain_additional = cls.VALIDATORS.get("additionalProperties")

    def additional_properties(validator: Any, allowed: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if "patternProperties" not in schema or plain_additional is None:  # no regex involved
            if plain_additional is not None:
                yield from plain_additional(validator, allowed, instance, schema)
            return
        if not validator.is_type(instance, "object"):
            return
        named = schema.get("properties") or {}
        extras = []
        for key in instance:
            if key in named:
                continue
            matches = [_search(p, key) for p in schema["patternProperties"]]
            failed = next((m for m in matches if isinstance(m, ValidationError)), None)
            if failed is not None:
                yield failed
                return
            if not any(matches):
                extras.append(key)
        if validator.is_type(allowed, "object"):
            for key in extras:
                yield from validator.descend(instance[key], allowed, path=key)
        elif allowed is False and extras:
            yield ValidationError(f"{', '.join(repr(k) for k in sorted(extras))} not allowed: matches no property "
                                  f"name or pattern")

    return extend(cls, {"pattern": _pattern, "patternProperties": _pattern_properties,
                        "additionalProperties": additional_properties, "uniqueItems": _unique_items})
