"""The tool catalog: what every connected server offers, with schemas and resolved annotations."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from envace_mcp.toolbox.validation import ArgumentValidator, SchemaValidator

# What one server's listing may add to every act and rehearse prompt. Tool replies are clipped
# (`prompts.TOOL_OUTPUT_CHARS`); without these, one 1 MB description made a 1.8 MB act request and a
# server listing 10,000 tools a 2.95 MB one. Every cut is reported in `Toolbox.problems`.
MAX_NAME_CHARS = 128
"""The MCP spec's own bound on tool names (1-128 characters); a longer name is left out."""
MAX_DESCRIPTION_CHARS = 2_000
"""Several times the longest description of common servers (about 1,500 characters); a longer one is
cut, ending in "…", since its start still says what the tool does."""
MAX_SCHEMA_CHARS = 8_000
"""An input schema as JSON: room for about a hundred documented parameters. A longer one leaves its tool
out of the catalog rather than shown in part: a partial schema tells the model wrong arguments. An
output schema that long is dropped (the tool stays; only the rehearse prompt showed it)."""
MAX_CATALOG_TOOLS = 128
"""OpenAI's chat API refuses requests with more than 128 tools, and models pick tools worse long
before that; tools past it (in config and listing order) are left out."""
MAX_CATALOG_CHARS = 200_000
"""All tools' names, descriptions and schemas together (about 50k tokens, a quarter of a large
context); tools past it (in config and listing order) are left out."""


@dataclass(frozen=True)
class ToolAnnotations:
    """Behaviour hints with the MCP spec's defaults applied when a server leaves them out.

    Spec defaults: not read-only, destructive, not idempotent, open-world. `destructive` and
    `idempotent` only mean something for tools that are not read-only. Hints from untrusted
    servers are hints, not guarantees: hints that contradict each other (read-only *and*
    destructive) resolve to the unsafe reading, and a server configured with
    `"trust_annotations": false` gets `untrusted()` for every tool.
    """

    read_only: bool = False
    destructive: bool = True
    idempotent: bool = False
    open_world: bool = True
    title: str | None = None

    @classmethod
    def from_hints(cls, hints: Any | None) -> ToolAnnotations:
        """Resolve an `mcp.types.ToolAnnotations` (or a dict of camelCase/snake_case hints)."""
        if hints is None:
            return cls()

        def get(snake: str, camel: str) -> Any:
            if isinstance(hints, dict):
                return hints.get(snake, hints.get(camel))
            return getattr(hints, snake, None)

        read_only = bool(get("read_only_hint", "readOnlyHint") or False)
        destructive = get("destructive_hint", "destructiveHint")
        idempotent = get("idempotent_hint", "idempotentHint")
        open_world = get("open_world_hint", "openWorldHint")
        if read_only and destructive:  # a server claiming both is wrong about one: believe the unsafe one
            read_only = False
        return cls(
            read_only=read_only,
            destructive=False if read_only else (True if destructive is None else bool(destructive)),
            idempotent=True if read_only else bool(idempotent or False),
            open_world=True if open_world is None else bool(open_world),
            title=get("title", "title"),
        )

    @classmethod
    def untrusted(cls, *, read_only: bool = False, title: str | None = None) -> ToolAnnotations:
        """What a server whose hints are not trusted gets: the spec's defaults (destructive), or
        read-only where the user's own config says so (`read_only_tools`)."""
        return cls(read_only=True, destructive=False, idempotent=True, title=title) if read_only else cls(title=title)

    @property
    def kind(self) -> str:
        """One word for messages: read-only, destructive or not destructive."""
        return "read-only" if self.read_only else "destructive" if self.destructive else "not destructive"

    def as_dict(self) -> dict[str, Any]:
        return {
            "read_only": self.read_only,
            "destructive": self.destructive,
            "idempotent": self.idempotent,
            "open_world": self.open_world,
        }


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the agent sees it.

    `name` is what the model calls; it equals `remote_name` unless two servers offer the same
    name, in which case both are prefixed with their server's name (`bank_get_balance`).
    """

    name: str
    remote_name: str
    server: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    annotations: ToolAnnotations
    validator: ArgumentValidator = field(repr=False, compare=False, hash=False)

    @classmethod
    def create(
        cls,
        *,
        remote_name: str,
        server: str,
        description: str | None,
        input_schema: dict[str, Any] | None,
        output_schema: dict[str, Any] | None,
        annotations: ToolAnnotations,
        name: str | None = None,
    ) -> ToolSpec:
        schema = dict(input_schema or {"type": "object", "properties": {}})
        return cls(
            name=name or remote_name,
            remote_name=remote_name,
            server=server,
            description=description or "",
            input_schema=schema,
            output_schema=dict(output_schema) if output_schema else None,
            annotations=annotations,
            validator=ArgumentValidator(schema),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolSpec:
        """An entry from `to_dict`'s JSON (a trace's `tools`, a saved catalog), or from an MCP `Tool` as
        `tools/list` returns it (`inputSchema`, `outputSchema`, `annotations` hints). Annotations are
        read as hints are (contradictions resolve to the unsafe reading); a bad entry is a ValueError."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
            raise ValueError("a tool needs a name")
        hints = data.get("annotations") if isinstance(data.get("annotations"), dict) else {}
        hints = {"read_only_hint": hints.get("read_only", hints.get("readOnlyHint")),
                 "destructive_hint": hints.get("destructive", hints.get("destructiveHint")),
                 "idempotent_hint": hints.get("idempotent", hints.get("idempotentHint")),
                 "open_world_hint": hints.get("open_world", hints.get("openWorldHint"))}
        schema = data.get("input_schema", data.get("inputSchema"))
        output = data.get("output_schema", data.get("outputSchema"))
        for what, value in (("input schema", schema), ("output schema", output)):
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"tool {data['name']!r}: its {what} is not an object")
        description = data.get("description")
        return cls.create(remote_name=str(data.get("remote_name") or data["name"]), server=str(data.get("server") or ""),
                          description=description if isinstance(description, str) else None, input_schema=schema,
                          output_schema=output, annotations=ToolAnnotations.from_hints(hints), name=data["name"])

    @functools.cached_property
    def output_validator(self) -> SchemaValidator | None:
        """The output schema's validator (any JSON value: 2026-07-28 allows arrays, strings, numbers,
        null as structured content), or `None` when the tool has no output schema. Built on first use:
        only rehearsals and result checks need it."""
        return SchemaValidator(self.output_schema) if self.output_schema is not None else None

    def renamed(self, name: str) -> ToolSpec:
        return replace(self, name=name)

    def same_tool(self, other: ToolSpec) -> bool:
        """Whether `other` is this tool as far as running it goes: same server, same remote tool, same
        annotations and schemas (the catalog name and the description may differ). The one identity of a
        tool (`behaviour`): the toolbox runs a call only on the tool it was judged as, the graph's gate binds
        its decision to it (`graph.proposal.spec_digest`), and trust tables and rules files bind to it."""
        return self.behaviour == other.behaviour

    @functools.cached_property
    def behaviour(self) -> str:
        """What running this tool depends on, as a digest: server, remote tool, annotations and schemas
        (`same_tool`). A world model's trust is bound to it (`policy.trust.ToolTrust.covers`): a changed
        schema, or another server's tool of the same name, is a tool it was not measured on."""
        text = json.dumps([self.server, self.remote_name, self.annotations.as_dict(), self.input_schema,
                           self.output_schema], sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def summary(self) -> str:
        """`server 'bank''s 'transfer' (destructive)`: what a message about this tool names."""
        return f"server {self.server!r}'s {self.remote_name!r} ({self.annotations.kind})"

    def without_parameters(self, names: Iterable[str]) -> ToolSpec:
        """This tool with some top-level parameters removed from its input schema (bound elsewhere)."""
        drop = set(names)
        schema = dict(self.input_schema)
        schema["properties"] = {k: v for k, v in (schema.get("properties") or {}).items() if k not in drop}
        if "required" in schema:
            schema["required"] = [r for r in schema["required"] if r not in drop]
        return ToolSpec.create(remote_name=self.remote_name, server=self.server, description=self.description,
                               input_schema=schema, output_schema=self.output_schema,
                               annotations=self.annotations, name=self.name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (what `envace servers ls --json` prints and prompts render)."""
        return {
            "name": self.name,
            "remote_name": self.remote_name,
            "server": self.server,
            "description": self.description,
            "input_schema": self.input_schema,
            "output_schema": self.output_schema,
            "annotations": self.annotations.as_dict(),
        }

    def to_openai(self) -> dict[str, Any]:
        """The `{"type": "function", ...}` shape chat templates take as `tools=`."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }


def _chars(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str))


def bound_tool(spec: ToolSpec) -> tuple[ToolSpec | None, list[str]]:
    """One listed tool within the per-tool bounds (`MAX_*` above): the entry to keep (`None`: leave it
    out) and what was cut, one line each."""
    where = f"tool {spec.remote_name[:MAX_NAME_CHARS]!r} of server {spec.server!r}"
    if len(spec.remote_name) > MAX_NAME_CHARS:
        return None, [f"{where}: its name is {len(spec.remote_name):,} characters, over the {MAX_NAME_CHARS} "
                      "MCP allows; the tool is left out"]
    size = _chars(spec.input_schema)
    if size > MAX_SCHEMA_CHARS:
        return None, [f"{where}: its input schema is {size:,} characters of JSON, over {MAX_SCHEMA_CHARS:,}; "
                      "the tool is left out (a schema shown in part would mislead the model)"]
    cuts: list[str] = []
    if len(spec.description) > MAX_DESCRIPTION_CHARS:
        cuts.append(f"{where}: description cut from {len(spec.description):,} to {MAX_DESCRIPTION_CHARS:,} characters")
        spec = replace(spec, description=spec.description[: MAX_DESCRIPTION_CHARS - 1] + "…")
    if spec.output_schema is not None and (size := _chars(spec.output_schema)) > MAX_SCHEMA_CHARS:
        cuts.append(f"{where}: output schema of {size:,} characters dropped (over {MAX_SCHEMA_CHARS:,})")
        spec = replace(spec, output_schema=None)
    return spec, cuts


def bound_catalog(specs: Iterable[ToolSpec]) -> tuple[list[ToolSpec], dict[str, str], list[str]]:
    """The tools that fit `MAX_CATALOG_TOOLS` and `MAX_CATALOG_CHARS`, in order; the names left out with
    why; and one problem line per server that lost tools."""
    kept: list[ToolSpec] = []
    left_out: dict[str, str] = {}
    lost: dict[str, list[str]] = {}
    total = 0
    for spec in specs:
        size = _chars(spec.to_openai())
        if len(kept) >= MAX_CATALOG_TOOLS:
            left_out[spec.name] = f"the catalog already holds {MAX_CATALOG_TOOLS} tools (its limit)"
        elif total + size > MAX_CATALOG_CHARS:
            left_out[spec.name] = f"the catalog's tools already fill {MAX_CATALOG_CHARS:,} characters (its limit)"
        else:
            kept.append(spec)
            total += size
            continue
        lost.setdefault(spec.server, []).append(spec.name)
    problems = []
    for server, names in lost.items():
        shown = ", ".join(repr(n) for n in names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        problems.append(f"server {server!r}: {len(names)} tool(s) left out, past the catalog's bounds of "
                        f"{MAX_CATALOG_TOOLS} tools and {MAX_CATALOG_CHARS:,} characters: {shown}")
    return kept, left_out, problems


def name_tools(per_server: dict[str, list[ToolSpec]]) -> tuple[dict[str, ToolSpec], list[str]]:
    """Give every tool its catalog name: prefix with the server's name only where names collide. A tool
    whose name is already another tool's (a server listing `bank_transfer` beside `bank`'s prefixed
    `transfer`, or two prefixed names alike) is left out, with one problem line each: a prefixed name
    keeps its tool, since it follows from the config, then the earlier server in config order. What one
    listing gets wrong costs that listing's tools, never the catalog."""
    owners: dict[str, list[str]] = {}
    for server, specs in per_server.items():
        for spec in specs:
            owners.setdefault(spec.remote_name, []).append(server)
    wanted = [(spec.remote_name if len(owners[spec.remote_name]) == 1 else f"{server}_{spec.remote_name}", spec)
              for server, specs in per_server.items() for spec in specs]
    holders: dict[str, ToolSpec] = {}
    for name, spec in sorted(wanted, key=lambda w: w[0] == w[1].remote_name):  # stable: prefixed names first
        if name not in holders:
            holders[name] = spec
    named: dict[str, ToolSpec] = {}
    problems: list[str] = []
    for name, spec in wanted:  # config and listing order
        holder = holders[name]
        if holder is spec:
            named[name] = spec.renamed(name)
        else:
            problems.append(f"server {spec.server!r}: its tool {spec.remote_name!r} would be named {name!r}, the name of "
                            f"server {holder.server!r}'s {holder.remote_name!r}; it is left out (rename one of the "
                            "servers in the config to keep both)")
    return named, problems


class ToolCatalog:
    """An ordered, read-only view of the tools of every connected server."""

    def __init__(self, specs: Iterable[ToolSpec]) -> None:
        self._specs = {spec.name: spec for spec in specs}

    def __getitem__(self, name: str) -> ToolSpec:
        return self._specs[name]

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    @property
    def names(self) -> list[str]:
        return list(self._specs)

    def lookup(self, server: str, remote_name: str) -> ToolSpec | None:
        """The catalog entry for a server's own tool name (which may be prefixed in the catalog)."""
        for spec in self._specs.values():
            if spec.server == server and spec.remote_name == remote_name:
                return spec
        return None

    def for_server(self, server: str) -> list[ToolSpec]:
        return [spec for spec in self._specs.values() if spec.server == server]

    def to_dicts(self) -> list[dict[str, Any]]:
        return [spec.to_dict() for spec in self._specs.values()]
