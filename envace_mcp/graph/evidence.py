"""The run's own evidence, for the gate's evidence rules (`GateConfig.evidence`): no model involved.

`Evidence.of(messages)` reads what a run has seen; `objection` says why a destructive call should not run
by it (a call the server already refused, a write already done, an identifier nobody wrote)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage

from envace_mcp.graph.gate_config import GateConfig
from envace_mcp.policy.prompts import GRAPH_NOTE, NOT_EXECUTED
from envace_mcp.policy.types import ToolCall
from envace_mcp.toolbox import ToolSpec


@dataclass(frozen=True)
class Evidence:
    """What a run has seen, for the gate's evidence rules: `text`, the user's messages and the replies of
    calls that ran without error; `refused`, the calls (`call_key`) the real server refused since the
    last write that succeeded; `done`, the writes that succeeded since the user's last message. Built
    from the conversation by `Evidence.of`."""

    text: str = ""
    refused: frozenset[str] = frozenset()
    done: frozenset[str] = frozenset()

    @classmethod
    def of(cls, messages: list[AnyMessage], read_only: dict[str, bool] | None = None) -> Evidence:
        """From LangChain messages. `read_only`: tool name -> its annotation; a tool missing from it counts
        as one that writes, so its success clears `refused`. Replies the gate gave instead of a tool
        (`prompts.NOT_EXECUTED`) and the graph's own notes to the agent (`prompts.GRAPH_NOTE`) are not
        evidence of anything."""
        texts: list[str] = []
        refused: set[str] = set()
        done: set[str] = set()
        keys: dict[str, tuple[str, str]] = {}
        for message in messages:
            if isinstance(message, HumanMessage) and not message.additional_kwargs.get(GRAPH_NOTE):
                texts.append(_text(message.content))
                done.clear()
            elif isinstance(message, AIMessage):
                keys.update({c["id"]: (c["name"], call_key(c["name"], c["args"])) for c in message.tool_calls if c.get("id")})
            elif isinstance(message, ToolMessage) and not message.additional_kwargs.get(NOT_EXECUTED):
                name, key = keys.get(message.tool_call_id, (message.name or "", ""))
                if message.status == "error":
                    refused.add(key)
                    continue
                texts.append(_text(message.content))
                if not (read_only or {}).get(name, False):
                    refused.clear()
                    done.add(key)
        refused.discard("")
        done.discard("")
        return cls("\n".join(texts), frozenset(refused), frozenset(done))

    def grounded(self, value: str) -> bool:
        """Whether `value` occurs in `text` as a whole token (`BRK-1` is not found inside `BRK-1549`), in any
        case: a user who writes "aapl" and a model that writes "AAPL" name the same ticker, and servers that
        care about case reject the wrong one themselves."""
        return re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", self.text, re.IGNORECASE) is not None


def call_key(name: str, arguments: Any) -> str:
    return name + json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _text(content: Any) -> str:
    """A message's text, with a JSON reply's strings also written unescaped (ids with non-ASCII letters)."""
    if isinstance(content, list):
        content = "\n".join(str(b.get("text", "")) if isinstance(b, dict) else str(b) for b in content)
    text = str(content)
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return text + "\n" + json.dumps(value, ensure_ascii=False)


def _identifiers(arguments: dict[str, Any], schema: dict[str, Any]) -> list[tuple[str, str]]:
    """(argument, value) for each identifier-like string: no whitespace, not an enum or const (a list's
    strings included)."""
    props = schema.get("properties") or {}
    out = []
    for key, value in arguments.items():
        prop = props.get(key) or {}
        if not isinstance(prop, dict) or "enum" in prop or "const" in prop or any(
                isinstance(s, dict) and ("enum" in s or "const" in s) for s in prop.get("anyOf", [])):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item and not any(ch.isspace() for ch in item):
                out.append((key, item))
    return out


def objection(call: ToolCall, spec: ToolSpec, evidence: Evidence, config: GateConfig) -> str | None:
    """Why the run's own evidence says a destructive call should not run (None: it does not)."""
    key = call_key(call.name, call.arguments)
    if "repeated_failures" in config.evidence and key in evidence.refused:
        return "the server refused this exact call earlier in this run, and no write has succeeded since"
    if "repeated_writes" in config.evidence and key in evidence.done:
        return "this exact call already succeeded earlier in this run, since the user's last message: it is done"
    if "ungrounded_arguments" in config.evidence:
        for argument, value in _identifiers(call.arguments, spec.input_schema):
            if not evidence.grounded(value):
                return f"{argument}={value!r} appears nowhere in the user's messages or in any tool's reply"
    return None

