"""How a session reaches its server: the SDK client for an in-process, stdio or HTTP server, with the
stdio transport made to answer replies it cannot read; and how a transport's failure is described."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import IO, Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client import Transport
from mcp.client._transport import TransportStreams
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from mcp.types import PARSE_ERROR, ErrorData, Implementation, JSONRPCError

from envace_mcp._text import visible
from envace_mcp._version import __version__
from envace_mcp.toolbox.config import HttpServer, InProcessServer, ServerSpec, StdioServer

logger = logging.getLogger(__name__)


def open_client(spec: ServerSpec, stack: AsyncExitStack, *, stderr: IO[str] | None, **options: Any) -> Client:
    """An SDK client for `spec`'s server (not yet entered); `stderr`: where a stdio server writes its own
    (None: this process's stderr); `options`: the client's own (info, mode, cache, handlers)."""
    if isinstance(spec, InProcessServer):
        return Client(spec.server, **options)
    if isinstance(spec, StdioServer):
        # "replace": one byte that is not UTF-8 on the server's stdout otherwise kills the SDK's reader,
        # and every later call on the session times out with nothing said
        params = StdioServerParameters(command=spec.command, args=spec.args, env=spec.env, cwd=spec.cwd,
                                       encoding_error_handler="replace")
        errlog = stderr if stderr is not None else sys.stderr
        return Client(answering_unreadable(stdio_client(params, errlog=errlog)), **options)
    assert isinstance(spec, HttpServer)
    if not spec.headers:
        return Client(spec.url, **options)
    http = httpx2.AsyncClient(headers=spec.headers, timeout=httpx2.Timeout(30.0, read=300.0))
    stack.push_async_callback(http.aclose)
    return Client(streamable_http_client(spec.url, http_client=http), **options)


def implementation(name: str) -> Implementation:
    """What this client calls itself to servers."""
    return Implementation(name=name, version=__version__)


@asynccontextmanager
async def answering_unreadable(transport: Transport) -> AsyncIterator[TransportStreams]:
    """The SDK's stdio transport, except that a reply the SDK cannot read (nested deeper than its JSON
    parser allows, say) is answered, for the request it belongs to, with a JSON-RPC parse error: the
    call fails at once as a malformed result instead of waiting out its whole timeout."""
    async with transport as (read, write):
        send, receive = anyio.create_memory_object_stream[Any](0)

        async def pump() -> None:
            async with send:
                async for item in read:
                    if isinstance(item, Exception):
                        item = _error_reply(item) or item
                    try:
                        await send.send(item)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            try:
                yield receive, write
            finally:
                tg.cancel_scope.cancel()


_HEAD_ID = re.compile(r'^\s*\{(?:(?!"(?:result|error)"\s*:).)*?"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")', re.S)


def _error_reply(exc: Exception) -> SessionMessage | None:
    """A JSON-RPC error answering the reply that failed to parse, when its request id can be read."""
    errors = exc.errors() if hasattr(exc, "errors") else []
    raw = next((e.get("input") for e in errors if isinstance(e.get("input"), str)), None)
    if raw is None:
        return None
    message_id: Any = None
    try:
        parsed = json.loads(raw)
        if isinstance(parsed, dict) and ("result" in parsed or "error" in parsed):
            message_id = parsed.get("id")
    except (ValueError, RecursionError):
        head = _HEAD_ID.match(raw[:4096])
        message_id = json.loads(head.group(1)) if head else None
    if not isinstance(message_id, (int, str)) or isinstance(message_id, bool):
        return None
    reason = errors[0].get("msg", "unreadable") if errors else "unreadable"
    reason = visible(str(reason))
    logger.warning("an MCP server's reply to request %r could not be read (%s); the call fails", message_id, reason)
    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=message_id,
                                       error=ErrorData(code=PARSE_ERROR, message=f"unreadable reply: {reason}")))


class _OneLine(logging.Filter):
    """The SDK logs every unreadable stdout line with a full pydantic traceback; one line says as much."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            first = str(record.exc_info[1]).splitlines()
            record.msg = f"{record.getMessage()}: {' / '.join(first[:3])[:300]}"
            record.args = ()
            record.exc_info = None
        return True


logging.getLogger("mcp.client.stdio").addFilter(_OneLine())


def describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e) for e in exc.exceptions)
    lines = str(exc).splitlines()
    if len(lines) > 4:  # pydantic lists every invalid field of a listing: the first few say enough
        lines = [*lines[:4], f"... ({len(lines) - 4} more lines)"]
    text = visible("\n".join(lines), newlines=True)  # a server's words: logging prints them as they are
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
