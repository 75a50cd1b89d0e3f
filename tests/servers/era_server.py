"""An MCP server (SDK 2, low-level `Server`) that speaks one protocol era, for the toolbox's era tests.

    python tests/servers/era_server.py modern|legacy stdio
    python tests/servers/era_server.py modern|legacy http PORT

`modern` is the SDK's own dual-era server, which a client probing `server/discover` speaks to
statelessly (2026-07-28). `legacy` is the handshake-only loop the SDK keeps for 2025 clients; over
HTTP it also answers a request that carries no session id and is not `initialize` with 400, as a
2025 stateful server does, so `server/discover` never reaches it. With `ERA_LOG` set, every request
the server receives is appended to that file as one JSON line: its method and the protocol version
it came under, and over HTTP the session id the request carried and the one the response issued.
That log is the wire's witness: initialize or not, session ids or not, how often tools/list came.
`ERA_TTL_MS` sets the `ttlMs` hint on tools/list (2026-07-28 results only: a handshake-era result has
no caching hints). The tool `grow` adds the tool `extra` and says the list changed: a
`subscriptions/listen` event on a 2026 connection, a notification on a handshake-era one.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.caching import CacheHint
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.subscriptions import ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"

ORDER = {
    "$schema": DRAFT_2020_12,
    "type": "object",
    "$defs": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
        "line": {"type": "object", "properties": {"sku": {"$ref": "#/$defs/sku"}, "qty": {"type": "integer", "minimum": 1}},
                 "required": ["sku", "qty"], "unevaluatedProperties": False},
    },
    "properties": {
        "kind": {"const": "order"},
        "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1},
        "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}], "items": False},
        "gift": {"type": "boolean"},
        "message": {"type": "string"},
    },
    "required": ["kind", "lines"],
    "dependentRequired": {"gift": ["message"]},
    "unevaluatedProperties": False,
}
"""2020-12 throughout: `$defs`/`$ref`, `prefixItems` with `items: false`, `unevaluatedProperties`,
`const`, `dependentRequired`."""

OLD = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "definitions": {"n": {"type": "integer", "minimum": 0}},
    "properties": {"n": {"$ref": "#/definitions/n"}, "pair": {"type": "array", "items": [{"type": "string"},
                                                                                       {"type": "integer"}]}},
    "dependencies": {"pair": ["n"]},
    "required": ["n"],
}
"""Draft-07, which servers still send: `definitions`, tuple `items`, `dependencies`."""

SHAPES: dict[str, Any] = {"array": [1, 2, 3], "string": "plain", "number": 4.5, "null": None,
                          "nested": {"a": [{"b": [None, True, {"c": "deep"}]}]}, "bool": False}
SHAPE_OUTPUT = {
    "$schema": DRAFT_2020_12,
    "anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "string"}, {"type": "number"},
              {"type": "null"}, {"type": "boolean"},
              {"type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"]}],
}
"""A non-object output schema: 2026-07-28 allows any JSON value as `structuredContent`."""


def tools(grown: bool, modern: bool) -> list[types.Tool]:
    """The listing; a handshake-era one has `shape` without its output schema (2025 revisions allow
    object schemas only)."""
    listed = [
        types.Tool(name="order", description="Place an order.", input_schema=ORDER),
        types.Tool(name="old", description="A draft-07 tool.", input_schema=OLD),
        types.Tool(name="shape", description="Answer with structured content of the given JSON type.",
                   input_schema={"type": "object", "properties": {"kind": {"enum": sorted(SHAPES)}},
                                 "required": ["kind"]},
                   output_schema=SHAPE_OUTPUT if modern else None),
        types.Tool(name="grow", description="Add the tool 'extra'.", input_schema={"type": "object"}),
        types.Tool(name="die", description="Exit the server process mid-call.", input_schema={"type": "object"}),
    ]
    if grown:
        listed.append(types.Tool(name="extra", description="Added by grow.", input_schema={"type": "object"}))
    return listed


def build(witness: bool = True) -> tuple[Server, NotificationOptions]:
    """The server; `witness`: log each request it handles (over HTTP the wire is logged instead: the
    2026 HTTP entry runs the tools/list handler itself to check a call's headers)."""
    log_path = os.environ.get("ERA_LOG") if witness else None
    ttl_ms = int(os.environ.get("ERA_TTL_MS", "0"))
    bus = InMemorySubscriptionBus()
    state = {"grown": False}

    def log(**entry: Any) -> None:
        if log_path:
            with open(log_path, "a") as fh:
                fh.write(json.dumps(entry) + "\n")

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools(state["grown"], ctx.protocol_version in MODERN_PROTOCOL_VERSIONS))

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name == "shape":
            value = SHAPES[arguments["kind"]]
            if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS and not isinstance(value, dict):
                value = {"value": value}  # 2025 revisions carry objects only
            return types.CallToolResult(content=[types.TextContent(text=json.dumps(value))], structured_content=value)
        if params.name == "die":
            os._exit(3)
        if params.name == "grow":
            state["grown"] = True
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                await bus.publish(ToolsListChanged())
            else:
                await ctx.session.send_tool_list_changed()
        return types.CallToolResult(content=[types.TextContent(text=f"{params.name} {json.dumps(arguments)}")])

    server = Server("era", on_list_tools=list_tools, on_call_tool=call_tool,
                    on_subscriptions_listen=ListenHandler(bus),
                    cache_hints={"tools/list": CacheHint(ttl_ms=ttl_ms)} if ttl_ms else None)

    async def witness(ctx: Any, call_next: Any) -> Any:
        log(method=ctx.method, version=ctx.protocol_version)
        return await call_next(ctx)

    server.middleware.append(witness)
    return server, NotificationOptions(tools_changed=True)


async def serve_stdio(era: str) -> None:
    from mcp.server.runner import serve_loop
    from mcp.server.stdio import stdio_server

    server, notifications = build()
    options = server.create_initialization_options(notifications)
    async with stdio_server() as (read, write):
        if era == "modern":
            await server.run(read, write, options)
        else:
            async with server.lifespan(server) as state:
                await serve_loop(server, read, write, lifespan_state=state, init_options=options)


def http_app(era: str) -> Any:
    """The server's Starlette app, wrapped in a witness of session ids (and, for `legacy`, a 2025
    server's refusal of requests outside a session)."""
    server, _ = build(witness=False)
    app = server.streamable_http_app(stateless_http=False)
    log_path = os.environ.get("ERA_LOG")

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            method = json.loads(body).get("method")
        except (ValueError, AttributeError):
            method = None
        issued: list[str] = []

        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:  # after the body: whatever comes next (the disconnect)
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start":
                issued.extend(v.decode() for k, v in message.get("headers", []) if k.lower() == b"mcp-session-id")
            await send(message)

        if log_path:
            with open(log_path, "a") as fh:
                fh.write(json.dumps({"http_method": method, "session": headers.get("mcp-session-id"),
                                     "protocol_header": headers.get("mcp-protocol-version")}) + "\n")
        if era == "legacy" and method != "initialize" and "mcp-session-id" not in headers:
            await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps(
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Bad Request: Missing session ID"}}
            ).encode()})
            return
        await app(scope, replay, watch)
        if log_path and issued:
            with open(log_path, "a") as fh:
                fh.write(json.dumps({"issued_session": issued[0]}) + "\n")

    return wrapped


def main() -> None:
    era, transport = sys.argv[1], sys.argv[2]
    if transport == "stdio":
        anyio.run(serve_stdio, era)
        return
    import uvicorn

    uvicorn.run(http_app(era), host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")


if __name__ == "__main__":
    main()
