"""One way to write settings: a pydantic model per component, and one parser for what people type.

Every component's settings (`GateConfig`, `RunLimits`, `EvalConfig`, `SFTConfig`, `GRPOConfig`) is a
`Settings` model: frozen, unknown keys refused, each default with its reason. They are written three
ways, all read here:

    key=value,key=value            --gate on_unusable=block,require_approval=never   (CLI, ENVACE_GATE)
    key=[a,b]                      --gate evidence=[repeated_writes,ungrounded_arguments]
    group.key=value                -c performance.micro_tokens=8192                   (nested settings)
    {"key": value, ...}            -c grpo.json, an adapter's envace.json, a served context

A value typed on a command line is read as its field's type says (`yes`/`no` for a bool, `none` where
the field may be None); a bad one is one `UserError` line naming where it came from, the key, what it
takes, and a close match for a misspelt key.
"""

from __future__ import annotations

import difflib
import json
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from envace_mcp.errors import UserError

S = TypeVar("S", bound=BaseModel)


class Settings(BaseModel):
    """Base of every settings model: frozen, and a key it does not know is an error, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """`key: a → b` for each setting (dotted for nested ones) that differs between two JSON forms."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b), key=str):
            out += differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {json.dumps(a)} → {json.dumps(b)}"]


def settings_text(settings: dict[str, Any]) -> str:
    """Settings as `key=value,...` the way they are typed (`true`, `[a,b]`): what a run prints of them."""
    def text(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, (list, tuple)):
            return "[" + ",".join(text(v) for v in value) + "]"
        return "none" if value is None else str(value)

    return ",".join(f"{key}={text(value)}" for key, value in settings.items())


def split_pairs(text: str) -> list[str]:
    """`a=1,b=[x,y],c=2` into its pairs: commas inside brackets belong to the value."""
    pairs, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            pairs.append(text[start:i])
            start = i + 1
    pairs.append(text[start:])
    return [p.strip() for p in pairs if p.strip()]


def parse_text(text: str, model: type[BaseModel], where: str) -> dict[str, Any]:
    """`key=value,...` as a (nested) dict of raw values for `model`: keys checked against its fields
    (dotted keys reach nested models), values left as text for pydantic to type, except `none`/`null`
    (None) and `[a,b]` (a list). Validation happens in `build`."""
    given: dict[str, Any] = {}
    for pair in split_pairs(text):
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise UserError(f"{where}: {key!r} needs a value ({key}=...)")
        target, fields = given, model
        parts = key.split(".")
        for part in parts[:-1]:
            sub = _nested(fields, part)
            if sub is None:
                raise UserError(f"{where}: {_unknown(part, fields)}")
            target, fields = target.setdefault(part, {}), sub
        if parts[-1] not in fields.model_fields and parts[-1] not in _legacy_keys(fields):
            raise UserError(f"{where}: {_unknown(parts[-1], fields)}")
        target[parts[-1]] = _raw(raw.strip(), fields.model_fields.get(parts[-1]))
    return given


def _raw(raw: str, field: Any = None) -> Any:
    """`none`/`null` is None only for a field that may be None: `rehearse=none` is the word a Literal takes."""
    if raw.lower() in ("none", "null") and (field is None or _may_be_none(field.annotation)):
        return None
    if raw.startswith("[") and raw.endswith("]"):
        return [item.strip() for item in raw[1:-1].split(",") if item.strip()]
    return raw


def _may_be_none(annotation: Any) -> bool:
    import typing

    return annotation is None or annotation is type(None) or annotation is Any or any(
        _may_be_none(arg) for arg in typing.get_args(annotation) if typing.get_origin(annotation) is not typing.Literal)


def _nested(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The settings model a dotted key reaches: a nested model's field, or a dict field of settings a model
    names in `NESTED` (e.g. `EvalConfig.gate`: GateConfig settings over a default)."""
    if name in getattr(model, "NESTED", {}):
        return model.NESTED[name]  # type: ignore[attr-defined]
    field = model.model_fields.get(name)
    annotation = field.annotation if field is not None else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _legacy_keys(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(getattr(model, "LEGACY_KEYS", ()))


def _unknown(key: str, model: type[BaseModel]) -> str:
    moved = getattr(model, "MOVED", {})
    if key in moved:
        return f"{key!r} is not a setting of {model.__name__}: {moved[key]}"
    known = list(model.model_fields)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown setting {key!r}{hint} (known: {', '.join(known)})"


def build(model: type[S], *layers: dict[str, Any] | None, where: str, allowed: tuple[str, ...] | None = None) -> S:
    """`model` from layers of settings, later ones over earlier ones (nested dicts merged). `allowed`:
    the only top-level keys the last layer may set. A bad value is a UserError starting with `where`."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer is None:
            continue
        if not isinstance(layer, dict):
            raise UserError(f"{where}: settings must be an object of {model.__name__} fields, not {layer!r}")
        merged = _merge(merged, layer)
    if allowed is not None and layers and isinstance(layers[-1], dict):
        for key in layers[-1]:
            if key not in allowed:
                raise UserError(f"{where}: may set only {', '.join(allowed)}, not {key!r}")
    try:
        return model.model_validate(merged)
    except ValidationError as exc:
        raise UserError(f"{where}: {describe(exc, model)}") from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def describe(exc: ValidationError, model: type[BaseModel]) -> str:
    """A pydantic error as one line a person reads: the key, what it takes, what it got."""
    problems = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error["loc"] if not isinstance(p, int))
        if error["type"] == "missing":
            problems.append(f"{loc} is required")
            continue
        if error["type"] == "extra_forbidden":
            owner = model
            for part in loc.split(".")[:-1]:
                owner = _nested(owner, part) or owner
            problems.append(_unknown(loc.split(".")[-1], owner))
            continue
        message = error["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
        got = error.get("input")
        shown = "" if isinstance(got, dict) or error["type"] == "value_error" else f", not {got!r}"
        problems.append(f"{loc + ' ' if loc else ''}must be {message}{shown}" if error["type"] != "value_error"
                        else f"{loc + ': ' if loc else ''}{message}")
    return "; ".join(problems)
