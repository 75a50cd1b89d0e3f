"""Argument validation against a tool's input schema, before any server sees the call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError
from jsonschema.validators import validator_for


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
        missing = [name for name in error.validator_value if name not in error.instance]
        if missing:
            path = f"{path}.{missing[0]}" if path else str(missing[0])
    elif error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        allowed = set((error.schema.get("properties") or {}).keys())
        extra = [name for name in error.instance if name not in allowed]
        if extra:
            path = f"{path}.{extra[0]}" if path else str(extra[0])
    return path


class ArgumentValidator:
    """A compiled JSON Schema validator for one tool's arguments.

    The validator class follows the schema's `$schema` (Draft 2020-12 when absent, as MCP specifies).
    A schema that is itself invalid is reported once at construction, and then every call is let
    through to the server, which is the authority on its own schema.
    """

    def __init__(self, schema: Mapping[str, Any] | None) -> None:
        self.schema = dict(schema or {"type": "object"})
        self.schema_error: str | None = None
        cls = validator_for(self.schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(self.schema)
        except jsonschema.SchemaError as exc:
            self.schema_error = exc.message
            self._validator = None
        else:
            self._validator = cls(self.schema, format_checker=cls.FORMAT_CHECKER)

    def errors(self, arguments: Any) -> list[dict[str, str]]:
        """Every violation as `{"field", "message"}`, most relevant first; empty when valid."""
        if self._validator is None:
            return []
        if not isinstance(arguments, Mapping):
            return [{"field": "", "message": f"arguments must be a JSON object, got {type(arguments).__name__}"}]
        found = sorted(self._validator.iter_errors(dict(arguments)), key=jsonschema.exceptions.relevance, reverse=True)
        return [{"field": field_path(e), "message": e.message} for e in found]
