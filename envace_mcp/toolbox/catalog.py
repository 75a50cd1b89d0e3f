"""The tool catalog: what every connected server offers, with schemas and resolved annotations."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from envace_mcp.errors import UserError
from envace_mcp.toolbox.validation import ArgumentValidator


@dataclass(frozen=True)
class ToolAnnotations:
    """Behaviour hints with the MCP spec's defaults applied when a server leaves them out.

    Spec defaults: not read-only, destructive, not idempotent, open-world. `destructive` and
    `idempotent` only mean something for tools that are not read-only. Hints from untrusted
    servers are hints, not guarantees.
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
        return cls(
            read_only=read_only,
            destructive=False if read_only else (True if destructive is None else bool(destructive)),
            idempotent=True if read_only else bool(idempotent or False),
            open_world=True if open_world is None else bool(open_world),
            title=get("title", "title"),
        )

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

    def renamed(self, name: str) -> ToolSpec:
        return ToolSpec(
            name=name,
            remote_name=self.remote_name,
            server=self.server,
            description=self.description,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            annotations=self.annotations,
            validator=self.validator,
        )

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


def name_tools(per_server: dict[str, list[ToolSpec]]) -> dict[str, ToolSpec]:
    """Give every tool its catalog name: prefix with the server's name only where names collide."""
    owners: dict[str, list[str]] = {}
    for server, specs in per_server.items():
        for spec in specs:
            owners.setdefault(spec.remote_name, []).append(server)
    named: dict[str, ToolSpec] = {}
    for server, specs in per_server.items():
        for spec in specs:
            name = spec.remote_name if len(owners[spec.remote_name]) == 1 else f"{server}_{spec.remote_name}"
            if name in named:
                raise UserError(
                    f"tool name {name!r} is ambiguous across servers {named[name].server!r} and {server!r}; "
                    "rename one of the servers in the config"
                )
            named[name] = spec.renamed(name)
    return named


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
