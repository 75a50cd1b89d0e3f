"""A JSON prefix checker: whether a text decoded so far can still become a tool call, or a tool's reply,
that its JSON schema accepts (`CallScanner`). The act role's calls (`constrained.CallConstraint`) and the
rehearse role's replies (`reply.ReplyConstraint`) are both held with it, token by token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_WHITESPACE = " \t\r\n"
_FIRST = {"string": '"', "number": "-0123456789", "integer": "-0123456789", "boolean": "tf", "null": "n",
          "object": "{", "array": "["}
_NUMBER = set("0123456789+-.eE")
_LITERALS = ("true", "false", "null")


class Violation(Exception):
    """The text so far cannot be the start of a call the schema accepts."""


def openings(schema: Any) -> str | None:
    """The characters a JSON value valid against `schema` may open with (None: any)."""
    kinds = _kinds(schema)
    return None if kinds is None else _opening(kinds)


def _opening(kinds: set[str]) -> str:
    return "".join(_FIRST.get(k, "") for k in kinds)


def _kinds(schema: Any) -> set[str] | None:
    """The JSON kinds a value of `schema` may be (None: any)."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return {_kind_of(v) for v in values}
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [_kinds(s) for s in schema[key]]
            return None if any(p is None for p in parts) else set().union(*parts)
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return set(kind)
    return {"object"} if "properties" in schema else None


def _bounds(schema: Any) -> tuple[tuple[float, bool] | None, tuple[float, bool] | None]:
    """(lower, upper) bounds a number of `schema` must keep, each (value, exclusive) or None; with anyOf /
    oneOf the loosest over the branches that allow a number (a branch with no bound: none)."""
    if not isinstance(schema, dict):
        return None, None
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [_bounds(b) for b in schema[key] if (_kinds(b) or {"number"}) & {"number", "integer"}]
            if not parts:
                return None, None
            lows, highs = [p[0] for p in parts], [p[1] for p in parts]
            low = None if None in lows else min(lows, key=lambda b: (b[0], b[1]))  # type: ignore[index]
            high = None if None in highs else max(highs, key=lambda b: (b[0], not b[1]))  # type: ignore[index]
            return low, high

    def bound(inclusive: str, exclusive: str) -> tuple[float, bool] | None:
        strict = schema.get(exclusive)
        if isinstance(strict, (int, float)) and not isinstance(strict, bool):
            return float(strict), True
        if isinstance(schema.get(inclusive), (int, float)) and not isinstance(schema.get(inclusive), bool):
            return float(schema[inclusive]), strict is True  # draft 4: exclusiveMinimum: true
        return None

    return bound("minimum", "exclusiveMinimum"), bound("maximum", "exclusiveMaximum")


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "string")


def _enum_strings(schema: Any) -> list[str] | None:
    """The allowed strings when a string value must be one of an enum's (None: any string)."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"] if v is not None):
        return [v for v in schema["enum"] if isinstance(v, str)]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [_enum_strings(s) for s in schema[key] if "string" in (_kinds(s) or {"string"})]
            return None if not parts or any(p is None for p in parts) else [v for p in parts for v in p]
    return None


@dataclass
class Frame:
    """One open object or array, and what it expects next."""

    kind: str  # "object" | "array"
    role: str  # "call" (a call's object), "args" (its arguments), "other"
    expect: str = "key"  # object: key | colon | value | comma; array: value | comma
    key: str | None = None
    keys: list[str] = field(default_factory=list)
    schema: Any = None  # what a nested value must be, where a scanner checks it (`reply.ReplyConstraint`)


@dataclass
class JsonString:
    """A string being read: a key, a tool's name, an enum value or a free string."""

    allowed: list[str] | None  # the whole string must be one of these (None: any string)
    is_key: bool
    text: str = ""
    escape: bool = False


@dataclass
class ScanState:
    """Where a scan is: in free text, inside a call's JSON (its open objects and arrays, a string or a
    literal being read, the tool named), or after the call's object closed."""

    mode: str = "text"  # text | json | after (the call's object closed, before </tool_call>)
    tail: str = ""
    stack: list[Frame] = field(default_factory=list)
    string: JsonString | None = None
    literal: str | None = None  # a number, true, false or null being read
    literal_kind: set[str] | None = None
    literal_bounds: tuple[Any, Any] = (None, None)
    name: str | None = None

    def clone(self) -> ScanState:
        """A copy to try a token on (deepcopy costs ~10x more, and 64 tries run per decoding step)."""
        string = self.string
        return ScanState(self.mode, self.tail, [Frame(f.kind, f.role, f.expect, f.key, list(f.keys), f.schema)
                                                for f in self.stack],
                         None if string is None else JsonString(string.allowed, string.is_key, string.text, string.escape),
                         self.literal, self.literal_kind, self.literal_bounds, self.name)


class CallScanner:
    """Whether a text can still become the tool call (or, `reply.ReplyConstraint`, the reply) its schema
    accepts, read one character at a time: outside a `<tool_call>` block any text goes; inside, the JSON
    call is checked as `constrained` describes. `feed(state, text)` raises `Violation` at the first
    character that no accepted call could have there; a `ScanState` is cheap to clone, so a constraint tries
    each candidate token on a copy. Subclasses check more through the hooks `value_schema`, `start_value`,
    `unused` and `close` (`reply._ReplyScanner`: nested objects against their `$ref`s).

    Args:
        schemas: tool name -> its arguments' JSON schema.
    """

    def __init__(self, schemas: dict[str, dict[str, Any]]) -> None:
        self.schemas = schemas

    def feed(self, state: ScanState, text: str) -> None:
        for char in text:
            self.char(state, char)

    def char(self, state: ScanState, c: str) -> None:
        if state.mode != "json":
            state.tail = (state.tail + c)[-len(CLOSE):]
            if state.mode == "text" and state.tail.endswith(OPEN):
                state.mode, state.stack, state.name = "json", [], None
            elif state.mode == "after" and state.tail.endswith(CLOSE):
                state.mode = "text"
            return
        if state.string is not None:
            self._string_char(state, c)
            return
        if state.literal is not None:
            if c in _NUMBER or c.isalpha():
                self._literal(state, state.literal + c, final=False)
                return
            self._literal(state, state.literal, final=True)
            state.literal = None
            self._value_done(state)
        if c in _WHITESPACE:
            return
        if not state.stack:
            if c != "{":
                raise Violation("a call is a JSON object")
            state.stack.append(Frame("object", "call"))
            return
        frame = state.stack[-1]
        if frame.expect == "key" and frame.kind == "object":
            if c == '"':
                state.string = JsonString(self.unused(state, frame), is_key=True)
            elif c == "}" and not frame.keys:
                self.close(state)
            else:
                raise Violation(f"expected a key, got {c!r}")
        elif frame.expect == "colon":
            if c != ":":
                raise Violation(f"expected ':', got {c!r}")
            frame.expect = "value"
        elif frame.expect == "value":
            if frame.kind == "array" and c == "]" and not frame.keys:
                self.close(state)
                return
            self.start_value(state, frame, c)
        elif frame.expect == "comma":
            closer = "}" if frame.kind == "object" else "]"
            if c == ",":
                if frame.kind == "object":
                    if self.unused(state, frame) == []:
                        raise Violation("every argument the tool declares is written")
                    frame.expect = "key"
                else:
                    frame.expect = "value"
            elif c == closer:
                self.close(state)
            else:
                raise Violation(f"expected ',' or {closer!r}, got {c!r}")

    def _string_char(self, state: ScanState, c: str) -> None:
        s = state.string
        assert s is not None
        if s.escape:
            s.escape = False
            s.text += "\\" + c
        elif c == "\\":
            if s.allowed is not None:
                raise Violation("no escapes in a name, a key or an enum value")
            s.escape = True
            return
        elif c == '"':
            if s.allowed is not None and s.text not in s.allowed:
                raise Violation(f"{s.text!r} is not one of {s.allowed}")
            state.string = None
            frame = state.stack[-1]
            if s.is_key:
                frame.key = s.text
                frame.keys.append(s.text)
                frame.expect = "colon"
            else:
                if frame.role == "call" and frame.key == "name":
                    state.name = s.text
                self._value_done(state)
            return
        else:
            s.text += c
        if s.allowed is not None and not any(a.startswith(s.text) for a in s.allowed):
            raise Violation(f"{s.text!r} starts none of {s.allowed}")

    def start_value(self, state: ScanState, frame: Frame, c: str) -> None:
        schema = self.value_schema(state, frame)
        kinds = {"string"} if frame.role == "call" and frame.key == "name" else (
            _kinds(schema) if schema is not None else None)
        if kinds is not None and c not in _opening(kinds):
            raise Violation(f"a value of kind {sorted(kinds)} cannot start with {c!r}")
        if frame.kind == "array":
            frame.keys.append("")  # counts items, so ']' after a ',' is refused
        if c == '"':
            allowed = list(self.schemas) if frame.role == "call" and frame.key == "name" else _enum_strings(schema)
            state.string = JsonString(allowed, is_key=False)
        elif c == "{":
            role = "args" if frame.role == "call" and frame.key == "arguments" else "other"
            state.stack.append(Frame("object", role))
        elif c == "[":
            state.stack.append(Frame("array", "other", expect="value"))
        elif c in _NUMBER or c.isalpha():
            state.literal_kind, state.literal_bounds = kinds, _bounds(schema)
            self._literal(state, c, final=False)
        else:
            raise Violation(f"no JSON value starts with {c!r}")

    def _literal(self, state: ScanState, text: str, *, final: bool) -> None:
        kinds = state.literal_kind
        if text[0].isalpha():
            if not any(word.startswith(text) for word in _LITERALS) or (final and text not in _LITERALS):
                raise Violation(f"{text!r} is not true, false or null")
        elif any(ch.isalpha() and ch not in "eE" for ch in text):
            raise Violation(f"{text!r} is not a number")
        elif kinds is not None and "number" not in kinds and "integer" in kinds and any(ch in ".eE" for ch in text):
            raise Violation(f"{text!r} is not an integer")
        else:
            self._in_bounds(text, state.literal_bounds, final=final)
        state.literal = text

    @staticmethod
    def _in_bounds(text: str, bounds: tuple[Any, Any], *, final: bool) -> None:
        low, high = bounds
        mantissa = text.lower().split("e")[0]
        if low is not None and low[0] >= 0 and text.startswith("-") and (
                low[0] > 0 or low[1] or any(ch in "123456789" for ch in mantissa)):
            raise Violation(f"{text!r} is below the minimum {low[0]:g}")
        if not final:
            return
        try:
            value = float(text)
        except ValueError:
            raise Violation(f"{text!r} is not a number") from None
        if low is not None and (value < low[0] or (low[1] and value == low[0])):
            raise Violation(f"{text!r} is below the {'exclusive ' if low[1] else ''}minimum {low[0]:g}")
        if high is not None and (value > high[0] or (high[1] and value == high[0])):
            raise Violation(f"{text!r} is above the {'exclusive ' if high[1] else ''}maximum {high[0]:g}")

    def _value_done(self, state: ScanState) -> None:
        frame = state.stack[-1]
        frame.expect = "comma"

    def close(self, state: ScanState) -> None:
        frame = state.stack[-1]
        if frame.role == "args":
            schema = self.schemas.get(state.name or "")
            missing = [k for k in (schema or {}).get("required") or [] if k not in frame.keys]
            if schema is not None and missing:
                raise Violation(f"required argument(s) missing: {', '.join(missing)}")
        state.stack.pop()
        if state.stack:
            self._value_done(state)
        else:
            state.mode, state.tail = "after", ""

    def _args_schema(self, state: ScanState) -> dict[str, Any] | None:
        return self.schemas.get(state.name) if state.name is not None else None

    def unused(self, state: ScanState, frame: Frame) -> list[str] | None:
        """Keys an `args` object may still take (None: any key)."""
        if frame.role != "args":
            return None
        props = (self._args_schema(state) or {}).get("properties")
        if not props:
            return None
        return [k for k in props if k not in frame.keys]

    def value_schema(self, state: ScanState, frame: Frame) -> Any:
        if frame.role != "args":
            return None
        props = (self._args_schema(state) or {}).get("properties") or {}
        return props.get(frame.key)
