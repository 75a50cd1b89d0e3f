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

from envace_mcp.toolbox.catalog import ToolAnnotations, ToolSpec
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


def spec_from_tool(tool: Any) -> ToolSpec:
    """The catalog entry of a LangChain tool: for ours (`MCPTool`), the very entry it was built from and
    checks every call against; for any other, one made from its schema and `metadata` annotations; for a
    tool in OpenAI's function format (a dict), one with the spec's defaults (destructive)."""
    if isinstance(tool, MCPTool):
        return tool.spec
    if isinstance(tool, dict):
        fn = tool.get("function", tool)
        return ToolSpec.create(remote_name=fn["name"], server="langchain", description=fn.get("description"),
                               input_schema=fn.get("parameters"), output_schema=None, annotations=ToolAnnotations())
    metadata = getattr(tool, "metadata", None) or {}
    schema = tool.args_schema if isinstance(tool.args_schema, dict) else tool.tool_call_schema.model_json_schema()
    return ToolSpec.create(remote_name=tool.name, server=str(metadata.get("server", "langchain")),
                           description=tool.description, input_schema=schema,
                           output_schema=metadata.get("output_schema"),
                           annotations=ToolAnnotations.from_hints(
                               {f"{k}_hint": v for k, v in (metadata.get("annotations") or {}).items()} or None))
