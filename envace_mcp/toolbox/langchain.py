"""The tool catalog as LangChain tools, for any existing LangChain or LangGraph agent.

Differences from a plain `StructuredTool` that matter to MCP users:
- arguments reach the server exactly as the model wrote them, including parameters named
  `runtime`, `config`, `callbacks` or `run_manager`, which LangChain's own machinery would
  otherwise consume (we bypass its signature-based injection);
- both `invoke` and `ainvoke` work (sync calls are carried to the toolbox's event loop);
- a failed call becomes a `ToolMessage(status="error")` carrying the full `ToolResult` as its
  artifact (structured content kept), instead of an exception that stops the graph;
- each tool keeps the catalog entry it was built from (`spec`) and runs only while the live catalog
  still has that tool under its name: a server that restarts with another listing cannot make an
  approved read-only name run something else (the call is a `tool_changed` error instead).
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from pydantic import ConfigDict

from envace_mcp.toolbox.catalog import MAX_NAME_CHARS, ToolAnnotations, ToolSpec
from envace_mcp.toolbox.result import ToolResult

_ARGS = "__envace_arguments"
_CALL_ID = "__envace_tool_call_id"


class MCPTool(BaseTool):
    """One catalog tool as a LangChain tool."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    scope: Any
    """The `ToolboxScope` (or any `ToolBackend` with `call_sync`) calls go through."""
    spec: ToolSpec
    """The catalog entry this tool was built from: what a gate judges, and what every call expects
    the live catalog still to hold (`Toolbox.call(expect=...)`)."""

    def _to_args_and_kwargs(self, tool_input: str | dict[str, Any], tool_call_id: str | None) -> tuple[tuple, dict]:
        # Pack the model's arguments into one private kwarg so no name of theirs can collide with
        # the `config` / `run_manager` injection in BaseTool.run, and keep the call id for the reply.
        arguments = self._parse_input(tool_input, tool_call_id)
        return (), {_ARGS: arguments, _CALL_ID: tool_call_id}

    def _run(self, **kwargs: Any) -> Any:
        result = self.scope.call_sync(self.name, kwargs[_ARGS], expect=self.spec)
        return _reply(self.name, result, kwargs[_CALL_ID])

    async def _arun(self, **kwargs: Any) -> Any:
        result = await self.scope.call(self.name, kwargs[_ARGS], expect=self.spec)
        return _reply(self.name, result, kwargs[_CALL_ID])


def _reply(name: str, result: ToolResult, tool_call_id: str | None) -> Any:
    if tool_call_id is None:
        return result.text
    return ToolMessage(
        content=result.text,
        artifact=result,
        tool_call_id=tool_call_id,
        name=name,
        status="error" if result.is_error else "success",
    )


def to_langchain_tools(scope: Any) -> list[MCPTool]:
    """One `MCPTool` per catalog entry; the JSON input schema is passed through untouched."""
    return [
        MCPTool(
            name=spec.name,
            description=spec.description or spec.name,
            args_schema=spec.input_schema,
            scope=scope,
            spec=spec,
            metadata={"server": spec.server, "annotations": spec.annotations.as_dict(), "output_schema": spec.output_schema},
        )
        for spec in scope.catalog
    ]


def spec_from_tool(tool: Any, *, trust_annotations: bool = True) -> ToolSpec:
    """The catalog entry of a LangChain tool: for ours (`MCPTool`), the very entry it was built from and
    checks every call against; for a tool in OpenAI's function format (a dict), one with the spec's
    defaults (destructive); for any other, one made from its schema and metadata, which is where
    LangChain's MCP libraries keep what the server said:

    - `langchain.mcp` (`MCPAdapter`): `metadata["mcp"]["tool"]["annotations"]` (snake_case hints) and
      the server's name in `metadata["mcp"]["server"]["name"]`;
    - `langchain-mcp-adapters`: the hints themselves as `metadata` (camelCase, `readOnlyHint`, ...); the
      server's name is not kept;
    - any tool: `metadata["annotations"]` in our own spelling (`{"read_only": True}`) and
      `metadata["server"]`, `metadata["output_schema"]`.

    Both libraries keep the server's input schema as `args_schema` (a dict, used as it is) and drop its
    output schema. Hints are read as a toolbox reads a server's: only true/false values count, a missing or
    contradictory one counts as destructive, and `trust_annotations=False` (a server you do not control)
    ignores them, so every such tool counts as destructive.
    """
    if isinstance(tool, MCPTool):
        return tool.spec
    if isinstance(tool, dict):
        fn = tool.get("function", tool)
        return ToolSpec.create(remote_name=fn["name"], server="langchain", description=fn.get("description"),
                               input_schema=fn.get("parameters"), output_schema=None, annotations=ToolAnnotations())
    metadata = tool.metadata if isinstance(getattr(tool, "metadata", None), dict) else {}
    hints, server = _origin(metadata)
    schema = tool.args_schema if isinstance(tool.args_schema, dict) else tool.tool_call_schema.model_json_schema()
    output = metadata.get("output_schema")
    return ToolSpec.create(remote_name=tool.name, server=server or "langchain", description=tool.description,
                           input_schema=schema, output_schema=output if isinstance(output, dict) else None,
                           annotations=ToolAnnotations.from_hints(hints) if trust_annotations
                           else ToolAnnotations.untrusted(title=hints.get("title")))


_HINTS = {"read_only": "readOnlyHint", "destructive": "destructiveHint", "idempotent": "idempotentHint",
          "open_world": "openWorldHint"}


def _origin(metadata: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A tool's annotation hints (as `ToolAnnotations.from_hints` reads them) and its server's name, from
    wherever the library that made it keeps them (`spec_from_tool`)."""
    nested = metadata.get("mcp")
    if isinstance(nested, dict):  # langchain.mcp
        tool, server = nested.get("tool"), nested.get("server")
        raw = tool.get("annotations") if isinstance(tool, dict) else None
        name = server.get("name") if isinstance(server, dict) else None
    elif any(camel in metadata for camel in _HINTS.values()):  # langchain-mcp-adapters
        raw, name = metadata, None
    else:
        raw, name = metadata.get("annotations"), metadata.get("server")
    raw = raw if isinstance(raw, dict) else {}
    hints: dict[str, Any] = {}
    for short, camel in _HINTS.items():
        value = next((raw[k] for k in (f"{short}_hint", camel, short) if k in raw), None)
        if isinstance(value, bool):  # a server's "false" (a string) or 0 is no hint, not a yes
            hints[f"{short}_hint"] = value
    if isinstance(raw.get("title"), str):
        hints["title"] = raw["title"]
    return hints, (name[:MAX_NAME_CHARS] if isinstance(name, str) and name else None)
