"""An MCP server whose tools ask for input mid-call, in either protocol era, for the asking-tool tests.

    python tests/servers/asking_server.py modern|legacy      (stdio)
    python tests/servers/asking_server.py http PORT          (streamable HTTP, 2026-07-28)

`pay(amount)` asks for a PIN before it pays (`Resolve(Elicit)`: on a 2026-07-28 connection the SDK
answers the call with an `InputRequiredResult`; on a 2025 one it sends `elicitation/create` mid-call).
`build()` is the same server in-process. Every payment and every `traceparent` the server saw in a
request's `_meta` is kept on the server (`paid`, `traceparents`) and, with `ASKING_LOG` set, appended
to that file as JSON lines.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel


class Pin(BaseModel):
    pin: str


def ask_pin() -> Elicit[Pin]:
    return Elicit("Enter the PIN that confirms this payment", Pin)


def build() -> MCPServer:
    server = MCPServer("payments", log_level="WARNING")
    server.paid = []  # type: ignore[attr-defined]
    server.traceparents = []  # type: ignore[attr-defined]

    def log(**entry: Any) -> None:
        if os.environ.get("ASKING_LOG"):
            with open(os.environ["ASKING_LOG"], "a") as f:
                f.write(json.dumps(entry) + "\n")

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    async def pay(amount: int, pin: Annotated[Pin, Resolve(ask_pin)], ctx: Context) -> str:
        """Pay `amount`, confirmed by the PIN the person gives."""
        meta = ctx.request_context.meta
        traceparent = (meta or {}).get("traceparent") if isinstance(meta, dict) else getattr(meta, "traceparent", None)
        server.traceparents.append(traceparent)  # type: ignore[attr-defined]
        server.paid.append((amount, pin.pin))  # type: ignore[attr-defined]
        log(paid=amount, pin=pin.pin, traceparent=traceparent)
        return f"paid {amount}"

    return server


async def main(era: str) -> None:
    from mcp.server.runner import serve_loop
    from mcp.server.stdio import stdio_server

    lowlevel = build()._lowlevel_server  # the MCPServer's own protocol server
    options = lowlevel.create_initialization_options()
    async with stdio_server() as (read, write):
        if era == "modern":
            await lowlevel.run(read, write, options)
        else:  # the handshake-only loop the SDK keeps for 2025 clients
            async with lowlevel.lifespan(lowlevel) as state:
                await serve_loop(lowlevel, read, write, lifespan_state=state, init_options=options)


if __name__ == "__main__":
    if sys.argv[1] == "http":
        build().run("streamable-http", port=int(sys.argv[2]))
    else:
        anyio.run(main, sys.argv[1])
