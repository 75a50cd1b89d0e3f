"""Tools as text for chat templates without native tool support: JSON schemas, or one line per tool.

The JSON form (`"json"`) is Hermes / Qwen's `# Tools` block with every schema in full, ~1,240 tokens
for the bank server's 9 tools. The compact form (`"compact"`, what the shipped SmolLM2 adapter was
trained on) writes each tool as a typed signature with its result's fields —

    - transfer(from_account_id: str, to_account_id: str, amount: num>0, memo?: str<=140 = "") -> {transfer_id, ...}
      Move money between two accounts. Fails on insufficient funds or unknown accounts.

— required parameters plain, optional ones with `?` and their default, enums as `"a"|"b"`, the bounds
that reject a call. Calls are written the same way in both (`<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`), so parsing does not change. Templates that render `tools=` themselves (Qwen3)
keep their own format: a real Qwen3 was trained on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from envace_mcp.errors import UserError

ToolFormat = Literal["json", "compact"]

OUTPUT_KEY = "x-envace-output"
"""Where a tool entry carries its output schema to this module (never shown to a native template)."""

COMPACT_HEAD = """\
# Tools
Call one as <tool_call>{"name": "tool", "arguments": {...}}</tool_call>. `arg?` = optional (= default); -> the result's fields."""


def native(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tool entries as a chat template's `tools=` takes them (without our output-schema key)."""
    if not tools:
        return None
    return [{**t, "function": {k: v for k, v in t["function"].items() if k != OUTPUT_KEY}} if "function" in t else t
            for t in tools]


def compact_block(tools: list[dict[str, Any]]) -> str:
    lines = [COMPACT_HEAD]
    seen: dict[str, str] = {}  # result fields -> the first tool returning them
    for tool in tools:
        fn = tool.get("function", tool)
        fields = result_fields(fn.get(OUTPUT_KEY))
        shown = f"same as {seen[fields]}" if fields in seen else fields
        if fields:
            seen.setdefault(fields, fn["name"])
        line = f"- {signature(fn['name'], fn.get('parameters') or {})}" + (f" -> {shown}" if shown else "")
        if fn.get("description"):
            line += f"\n  {' '.join(str(fn['description']).split())}"
        lines.append(line)
    return "\n".join(lines)


def signature(name: str, parameters: dict[str, Any], output: dict[str, Any] | None = None) -> str:
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    args = []
    for arg, schema in properties.items():
        text = f"{arg}{'' if arg in required else '?'}: {type_text(schema)}"
        if arg not in required and "default" in (schema or {}):
            text += f" = {json.dumps(schema['default'], ensure_ascii=False)}"
        args.append(text)
    out = f"{name}({', '.join(args)})"
    fields = result_fields(output)
    return f"{out} -> {fields}" if fields else out


def type_text(schema: Any) -> str:
    """A short type: `str`, `int>=1`, `"buy"|"sell"`, `num>0|null`, `list[str]`, `{street, city}`."""
    if not isinstance(schema, dict):
        return "any"
    if "enum" in schema:
        return "|".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return "|".join(type_text(s) for s in schema[key])
    kind = schema.get("type")
    if isinstance(kind, list):
        return "|".join(type_text({**schema, "type": k}) for k in kind)
    if kind == "array":
        return f"list[{type_text(schema.get('items', {}))}]"
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return "{" + ", ".join(props) + "}" if props else "dict"
    base = {"string": "str", "integer": "int", "number": "num", "boolean": "bool", "null": "null"}.get(kind, "any")
    return base + _bounds(schema)


def _bounds(schema: dict[str, Any]) -> str:
    marks = []
    for key, mark in (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<="),
                      ("maxLength", "<=")):
        if key in schema and not (key == "minimum" and "exclusiveMinimum" in schema):
            marks.append(f"{mark}{schema[key]}")
    return "".join(marks[:2])


def result_fields(output: dict[str, Any] | None) -> str:
    """`{a, b, items[]}`: the top-level fields a result has (arrays marked), or "" when unknown."""
    if not isinstance(output, dict):
        return ""
    props = output.get("properties") or {}
    if not props:
        return ""
    names = [f"{k}[]" if isinstance(v, dict) and v.get("type") == "array" else k for k, v in props.items()]
    return "{" + ", ".join(names) + "}"


FORMAT_FILE = "envace.json"
"""Beside a LoRA adapter: the prompt formats it was trained on (`{"tool_format": "compact",
"rehearse_format": "inline"}`), so loading the adapter renders prompts the way it learned them, and
optionally the gate it recommends (`"gate": {...}`, `envace_mcp.graph.adapter_gate`)."""

_FORMATS = {"tool_format": ("json", "compact"), "rehearse_format": ("simulator", "inline")}


def adapter_file(adapter: str | Path | None) -> dict[str, Any]:
    """An adapter folder's `envace.json` as an object; {} when there is none. A torn file, or one that
    is not an object, is a UserError naming it: guessing its formats would prompt the model in a shape
    it never learned."""
    if adapter is None:
        return {}
    path = Path(adapter) / FORMAT_FILE
    try:
        saved = json.loads(path.read_text())
    except OSError:
        return {}
    except ValueError as exc:
        raise UserError(f"{path} is not JSON ({exc})") from None
    if not isinstance(saved, dict):
        raise UserError(f"{path} must hold an object ({{\"tool_format\": ...}}), not {saved!r}")
    return saved


def adapter_formats(adapter: str | Path | None) -> dict[str, str]:
    """The prompt formats an adapter folder says it was trained on (only those it names); a value that is
    not a known format is a UserError naming the file."""
    return formats_of(adapter_file(adapter), adapter)


def formats_of(saved: dict[str, Any], adapter: str | Path | None) -> dict[str, str]:
    """The prompt formats an `envace.json` object (`adapter_file`) names, checked as `adapter_formats` does."""
    for key, allowed in _FORMATS.items():
        if key in saved and saved[key] not in allowed:
            raise UserError(f"{Path(adapter) / FORMAT_FILE}: {key} must be one of {', '.join(allowed)}, "  # type: ignore[arg-type]
                            f"not {saved[key]!r}")
    return {key: saved[key] for key in _FORMATS if key in saved}


def adapter_tool_format(adapter: str | Path | None) -> ToolFormat | None:
    """The tool format an adapter folder says it was trained on; None when it says nothing."""
    return adapter_formats(adapter).get("tool_format")  # type: ignore[return-value]


def write_adapter_format(folder: str | Path, tool_format: ToolFormat = "json", rehearse_format: str = "simulator",
                         reply_tokens: dict[str, int] | None = None) -> None:
    """`envace.json`: the prompt formats the adapter learned, and (a fitted world model's) each tool's
    longest training reply in tokens (`reply_budgets`)."""
    saved: dict[str, Any] = {"tool_format": tool_format, "rehearse_format": rehearse_format}
    if reply_tokens:
        saved["reply_tokens"] = dict(sorted(reply_tokens.items()))
    (Path(folder) / FORMAT_FILE).write_text(json.dumps(saved) + "\n")


MAX_REPLY_TOKENS = 2048
"""The most tokens a rehearsal budget is raised to for one tool, whatever an envace.json says."""


def reply_budgets(saved: dict[str, Any]) -> dict[str, int]:
    """The rehearsal budget of each tool an `envace.json` object lists in `reply_tokens` (its longest
    training reply): a fifth more than that reply and 8 tokens, at most `MAX_REPLY_TOKENS`; entries that
    are not a tool name and a positive count are dropped (the file is no more trusted than a server)."""
    listed = saved.get("reply_tokens")
    if not isinstance(listed, dict):
        return {}
    return {tool: min(MAX_REPLY_TOKENS, n + (n + 4) // 5 + 8) for tool, n in list(listed.items())[:1000]
            if isinstance(tool, str) and 0 < len(tool) <= 200 and isinstance(n, int) and not isinstance(n, bool) and n > 0}


def _one_format(traces: Iterable[Any], what: str, read: Callable[[Any], Any], default: str) -> str:
    """The one value of a prompt format that recorded runs share (`read(trace)`, None = `default`);
    mixed values are refused: one adapter learns one format. (Runs are `traces.Trace`, a layer above: not
    imported here.)"""
    found = {str(read(t) or default) for t in traces}
    if len(found) > 1:
        raise UserError(f"the runs were recorded with different {what} formats ({', '.join(sorted(found))}): "
                        "train one adapter per format")
    return found.pop() if found else default


def traces_rehearse_format(traces: Iterable[Any]) -> str:
    """The one rehearse prompt format recorded runs used (`Trace.rehearse_format`); mixed are refused."""
    return _one_format(traces, "rehearse", lambda t: getattr(t, "rehearse_format", None), "simulator")


def traces_tool_format(traces: Iterable[Any]) -> ToolFormat:
    """The one tool format recorded runs were rendered in (`Trace.metadata["tool_format"]`; runs recorded
    before it was recorded are "json"); mixed formats are refused: one adapter learns one format."""
    return _one_format(traces, "tool", lambda t: (getattr(t, "metadata", None) or {}).get("tool_format"),  # type: ignore[return-value]
                       "json")
