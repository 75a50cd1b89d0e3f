"""What a server lists, as catalog entries: its tools under the config's allow/deny lists and trust
settings, what was wrong with the listing, and the output checks its results get."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mcp import Client
from mcp.types import CallToolResult, Tool

from envace_mcp.toolbox.catalog import ToolAnnotations, ToolSpec, bound_tool
from envace_mcp.toolbox.config import ServerSpec

_LIST_PAGE_CAP = 100
"""A paginator that never ends must not hang start-up."""


def bounded_output_checks(client: Client, listed: Callable[[], Iterable[ToolSpec]]) -> None:
    """The SDK checks a result's structuredContent against the tool's output schema itself, with plain
    jsonschema: no time bound on `pattern`, `uniqueItems` pair by pair. A hostile schema and result held
    the event loop every server shares for seconds to hours, past any call's timeout. The same check
    runs here through the toolbox's bounded validator (`validation.SchemaValidator`), on the schema of
    the listing the catalog holds (`listed()`); errors reach the caller as a malformed result, as the SDK's did."""

    async def validate_tool_result(name: str, result: CallToolResult) -> None:
        spec = next((tool for tool in listed() if tool.remote_name == name), None)
        checks = spec.output_validator if spec is not None else None
        if checks is None:
            return
        if result.structured_content is None and "structured_content" not in result.model_fields_set:
            raise RuntimeError(f"Tool {name} has an output schema but did not return structured content")
        problems = checks.errors(result.structured_content)
        if problems:
            where = f"field '{problems[0]['field']}': " if problems[0]["field"] else ""
            raise RuntimeError(f"Invalid structured content returned by tool {name}: {where}{problems[0]['message']}")

    client.session.validate_tool_result = validate_tool_result  # type: ignore[method-assign]


async def list_tools(client: Client, server: str, spec: ServerSpec) -> tuple[list[ToolSpec], set[str], list[str]]:
    """The server's allowed tools as catalog entries, what it offers that the config denies, and what was
    wrong with the listing: a tool without a name or listed twice is left out, one whose input schema
    is unsafe stays listed (its calls are refused, with the reason), one past the per-tool bounds is cut
    or left out (`catalog.bound_tool`). Annotations are resolved under the server's trust settings."""
    specs: dict[str, ToolSpec] = {}
    denied: set[str] = set()
    problems: list[str] = []
    offered: set[str] = set()
    cursor: str | None = None
    for _ in range(_LIST_PAGE_CAP):
        page = await client.list_tools(cursor=cursor)
        for tool in page.tools:
            if not tool.name:
                problems.append(f"server {server!r} lists a tool with an empty name; it is left out")
                continue
            if tool.name in offered:
                problems.append(f"server {server!r} lists the tool {tool.name[:128]!r} twice; the second is left out")
                continue
            offered.add(tool.name)
            if not spec.allows(tool.name):
                denied.add(tool.name)
                continue
            if tool.name in spec.read_only_tools and ToolAnnotations.from_hints(tool.annotations).destructive:
                problems.append(f"server {server!r}: 'read_only_tools' names {tool.name[:128]!r}, which is destructive by "
                                "the server's annotations (or their absence); it counts as read-only, as configured, "
                                "and runs without approval")
            entry, cuts = bound_tool(ToolSpec.create(
                remote_name=tool.name,
                server=server,
                description=tool.description,
                input_schema=tool.input_schema,
                output_schema=tool.output_schema,
                annotations=_annotations(spec, tool),
            ))
            problems += cuts
            if entry is None:
                continue
            if entry.validator.refusal:
                problems.append(f"tool {tool.name!r} of server {server!r}: its input schema {entry.validator.refusal}; "
                                "calls to it are refused")
            specs[tool.name] = entry
        cursor = page.next_cursor
        if cursor is None:
            break
    problems += [f"server {server!r}: 'read_only_tools' names {name!r}, which the server does not offer"
                 for name in spec.read_only_tools if name not in offered]
    return list(specs.values()), denied, problems


def _annotations(spec: ServerSpec, tool: Tool) -> ToolAnnotations:
    """A tool's annotations under its server's trust settings: the user's `read_only_tools` first, then
    the server's hints where they are trusted, else the spec's defaults (destructive)."""
    title = getattr(tool.annotations, "title", None)
    if tool.name in spec.read_only_tools:
        return ToolAnnotations.untrusted(read_only=True, title=title)
    if not spec.trust_annotations:
        return ToolAnnotations.untrusted(title=title)
    return ToolAnnotations.from_hints(tool.annotations)
