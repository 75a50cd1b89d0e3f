"""Server configuration in the `mcpServers` JSON shape users already have.

    {"mcpServers": {
        "bank": {"command": "python", "args": ["-P", "-m", "envace_mcp.servers.bank"], "env": {"K": "V"}},
        "shop": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ..."}}
    }}

Extra keys are ours and optional: `timeout` (seconds per call), `startup_timeout` (seconds to start
and list tools), `required` (fail the toolbox if this server cannot start), `include_tools` /
`exclude_tools` (allow and deny lists, enforced before any call), `disabled` (skip the entry, as
several hosts do), `trust_annotations` and `read_only_tools` (whether the server's read-only /
destructive hints are believed, and which of its tools you declare read-only yourself), `sandbox`
(calls may be replayed against it with changed arguments: `envace traces import --mutate`).
In tests, an in-process server object (`MCPServer` or a low-level `Server`) may stand in for an entry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envace_mcp.errors import ConfigError


class _ServerBase(BaseModel):
    # strict: `"timeout": "5"` or `"args": "x"` is a mistake to report, not a value to coerce
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    timeout: float | None = Field(default=None, gt=0)
    """Per-call timeout in seconds for this server; `None` takes the toolbox's default."""
    include_tools: list[str] | None = None
    """Allow list of the server's own tool names; `None` allows all."""
    exclude_tools: list[str] = Field(default_factory=list)
    """Deny list; wins over the allow list."""
    required: bool = False
    """A required server that fails to start makes the toolbox fail to open; any other is reported
    in `Toolbox.problems` and left out (unless no server starts at all)."""
    startup_timeout: float | None = Field(default=None, gt=0)
    """Seconds to start, initialize and list tools; `None` takes the toolbox's `startup_timeout`."""
    trust_annotations: bool = True
    """Believe the server's `readOnlyHint` / `destructiveHint`. On by default: these are servers you chose
    to run, a tool without hints already counts as destructive (the MCP spec's default), and hints that
    contradict each other count as destructive. Off for a server you do not control: then every tool
    of it counts as destructive (a destructive call needs approval) unless `read_only_tools` names it."""
    read_only_tools: list[str] = Field(default_factory=list)
    """The server's own tool names that count as read-only whatever its hints say (your word, not the
    server's); a name the server does not offer is reported in `Toolbox.problems`."""
    sandbox: bool = False
    """Calls may be replayed with changed arguments against it (`envace traces import --mutate`): mark
    only a copy whose state you can lose. Off by default: a replay re-runs logged calls, deletes included."""

    def allows(self, remote_name: str) -> bool:
        if remote_name in self.exclude_tools:
            return False
        return self.include_tools is None or remote_name in self.include_tools


class StdioServer(_ServerBase):
    """A server launched as a subprocess, spoken to over its stdin/stdout.

    The child's environment is an allowlist: the SDK's safe defaults (HOME, LOGNAME, PATH, SHELL,
    TERM, USER) plus exactly the `env` given here. The parent's secrets are not inherited.
    """

    type: Literal["stdio"] = "stdio"
    command: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None


class HttpServer(_ServerBase):
    """A server reached over streamable HTTP."""

    type: Literal["http"] = "http"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)


class InProcessServer(_ServerBase):
    """A server object living in this process (fast, real protocol path; for tests and embedding)."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, arbitrary_types_allowed=True)
    type: Literal["inprocess"] = "inprocess"
    server: Any


ServerSpec = StdioServer | HttpServer | InProcessServer

_TYPE_ALIASES = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamable_http": "http", "streamableHttp": "http"}


def parse_server(name: str, entry: Any) -> ServerSpec:
    """One `mcpServers` entry (a dict, a spec, or an in-process server object) as a spec."""
    if isinstance(entry, (StdioServer, HttpServer, InProcessServer)):
        return entry
    if not isinstance(entry, Mapping):
        if _is_server_object(entry):
            return InProcessServer(server=entry)
        raise ConfigError(f"server {name!r}: expected an object with 'command' or 'url', got {type(entry).__name__}")
    data = dict(entry)
    kind = data.pop("type", None) or data.pop("transport", None)
    if kind is None:
        if "command" in data and "url" in data:
            raise ConfigError(f"server {name!r}: has both 'command' (stdio) and 'url' (HTTP); keep one, or say which "
                              "with 'type'")
        kind = "stdio" if "command" in data else "http" if "url" in data else None
    if kind == "sse":
        raise ConfigError(f"server {name!r}: the SSE transport is deprecated and not supported; use streamable HTTP")
    resolved = _TYPE_ALIASES.get(str(kind)) if kind is not None else None
    if resolved is None:
        raise ConfigError(f"server {name!r}: needs 'command' (stdio) or 'url' (streamable HTTP); got keys {sorted(entry)}")
    try:
        return StdioServer(**data) if resolved == "stdio" else HttpServer(**data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(entry)'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"server {name!r}: {problems}") from None


def load_servers(source: str | Path | Mapping[str, Any]) -> dict[str, ServerSpec]:
    """Read servers from a config file path, or from a mapping (with or without the `mcpServers` key)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"server config {str(path)!r} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"server config {str(path)!r} is not valid JSON: {exc}") from None
    else:
        raw = source
    if not isinstance(raw, Mapping):
        raise ConfigError("server config must be a JSON object")
    if "mcpServers" not in raw and "servers" not in raw:  # a bare name → server mapping, unless a key is a typo
        import difflib

        for key, value in raw.items():
            entry = isinstance(value, Mapping) and any(k in value for k in ("command", "url", "transport", "type"))
            if (isinstance(key, str) and not entry
                    and difflib.get_close_matches(key.lower(), ["mcpservers", "servers"], n=1, cutoff=0.75)):
                raise ConfigError(f"{key!r} would be read as a server's name; did you mean 'mcpServers'?")
    entries = raw.get("mcpServers", raw) if "mcpServers" in raw or "servers" not in raw else raw["servers"]
    if not isinstance(entries, Mapping):
        raise ConfigError("'mcpServers' must be an object mapping names to servers")
    servers: dict[str, ServerSpec] = {}
    for name, entry in entries.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"server names must be non-empty strings, got {name!r}")
        if isinstance(entry, Mapping) and "disabled" in entry:
            if not isinstance(entry["disabled"], bool):
                raise ConfigError(f"server {name!r}: 'disabled' must be true or false, not {entry['disabled']!r}")
            if entry["disabled"]:
                continue
        servers[name] = parse_server(name, entry)
    if not servers:
        raise ConfigError("no servers configured")
    return servers


def _is_server_object(obj: Any) -> bool:
    from mcp.server import Server
    from mcp.server.mcpserver import MCPServer

    return isinstance(obj, (Server, MCPServer))
