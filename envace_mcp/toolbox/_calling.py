"""One call on a server's live session, and every way it can end as data: a result, a tool error, a
timeout, a dead server, a call refused before it was sent."""

from __future__ import annotations

import difflib
import time
from collections.abc import Mapping
from typing import Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED
from pydantic import ValidationError

from envace_mcp.errors import UserError
from envace_mcp.toolbox import asking, tasks
from envace_mcp.toolbox._connection import Connection
from envace_mcp.toolbox._transport import describe
from envace_mcp.toolbox.catalog import ToolCatalog, ToolSpec
from envace_mcp.toolbox.result import ErrorKind, ToolResult, tool_changed

_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    EOFError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


async def send(conn: Connection, spec: ToolSpec, arguments: Any, *, limit: float, meta: Mapping[str, Any] | None,
               resume: asking.Resume | None, ask: asking.Asker | None, started: float) -> ToolResult:
    """Send the call to `spec`'s tool on `conn`'s live session, under `limit` seconds; whatever happens
    comes back as a result (a transport failure also marks the session dead, for a restart)."""
    client = conn.client
    assert client is not None
    name, generation = spec.name, conn.generation

    def failed(kind: ErrorKind, message: str, **details: Any) -> ToolResult:
        return ToolResult.error(kind, message, tool=name, server=spec.server, arguments=arguments,
                                details=details or None, latency_s=time.perf_counter() - started)

    token, mid_call = conn.questions.begin(ask)
    try:
        # tasks extension: a call the server runs as a task is polled to its end inside `call_tool` (and
        # cancelled there on timeout); `watch` collects its life for the result (toolbox/tasks.py)
        with anyio.fail_after(limit), tasks.watch() as watch:
            raw = await client.call_tool(spec.remote_name, dict(arguments), meta=dict(meta) if meta else None,
                                         **asking.seed(resume))
    except asking.InputAsked as asked:  # the server's questions go to the caller (toolbox/asking.py)
        return asking.waiting(asked.result, tool=name, server=spec.server, arguments=arguments, resume=resume,
                              latency_s=time.perf_counter() - started)
    except TimeoutError:
        return watch.attach(failed("timeout", f"Tool '{name}' timed out after {limit:g} s", timeout_s=limit))
    except MCPError as exc:
        if exc.code == CONNECTION_CLOSED:
            conn.mark_dead(generation, "connection closed during a call")
            return died(spec, arguments, f"server '{spec.server}' died during the call", started, conn)
        asked = mid_call.note(spec.server)  # a 2025 server that asked mid-call, refused, and failed for it
        return failed("tool_error", f"Tool '{name}' failed with a protocol error {exc.code}: {exc}"
                      + (f"\n{asked}" if asked else ""), code=exc.code)
    except _TRANSPORT_ERRORS as exc:
        conn.mark_dead(generation, describe(exc))
        return died(spec, arguments, f"server '{spec.server}' is unreachable: {describe(exc)}", started, conn)
    except (ValidationError, RuntimeError, ValueError) as exc:
        return failed("tool_error", f"Tool '{name}' returned a malformed result: {describe(exc)}")
    except Exception as exc:
        if _is_transport_failure(exc):
            conn.mark_dead(generation, describe(exc))
            return died(spec, arguments, f"server '{spec.server}' is unreachable: {describe(exc)}", started, conn)
        return watch.attach(failed("tool_error", f"Tool '{name}' failed: {describe(exc)}"))
    finally:
        conn.questions.end(token)
    note = mid_call.note(spec.server)  # a 2025 server asked mid-call and was refused: say so
    return watch.attach(ToolResult(
        tool=name,
        server=spec.server,
        arguments=arguments,
        content=[block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in raw.content]
        + ([{"type": "text", "text": note}] if note else []),
        structured_content=raw.structured_content,
        is_error=bool(raw.is_error),
        error_kind="tool_error" if raw.is_error else None,
        latency_s=time.perf_counter() - started,
        asked=mid_call.answered or None,
    ))


def refused(spec: ToolSpec, arguments: Any, expect: ToolSpec | None) -> ToolResult | None:
    """Why a call to this entry must not run: it is not the tool that was gated, or the arguments
    break its input schema."""
    if expect is not None and not spec.same_tool(expect):
        return tool_changed(spec.name, arguments, expect, spec)
    problems = spec.validator.errors(arguments)
    if not problems:
        return None
    first = problems[0]
    where = f"field '{first['field']}'" if first["field"] else "arguments"
    return ToolResult.error(
        "invalid_arguments",
        f"Invalid arguments for tool '{spec.name}': {where}: {first['message']}",
        tool=spec.name,
        server=spec.server,
        arguments=arguments,
        details={"field": first["field"], "errors": problems},
    )


def unknown(name: str, arguments: Any, expect: ToolSpec | None, *, catalog: ToolCatalog, left_out: Mapping[str, str],
            connections: Mapping[str, Connection]) -> ToolResult:
    """A call to a name the catalog does not hold: left out (and why), denied by a server's config, or unknown
    (with the names it may have meant)."""
    if expect is not None:
        return tool_changed(name, arguments, expect, None)
    if name in left_out:
        return ToolResult.error("unknown_tool", f"Tool '{name}' was left out of the catalog: {left_out[name]}",
                                tool=name, arguments=arguments, details={"available": catalog.names})
    for server, conn in connections.items():
        if name in conn.denied:
            return ToolResult.error(
                "denied",
                f"Tool '{name}' is not allowed by the configuration of server '{server}'",
                tool=name,
                server=server,
                arguments=arguments,
            )
    close = difflib.get_close_matches(name, catalog.names, n=3)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ToolResult.error(
        "unknown_tool",
        f"Unknown tool '{name}'{hint}",
        tool=name,
        arguments=arguments,
        details={"available": catalog.names},
    )


def died(spec: ToolSpec, arguments: Any, message: str, started: float, conn: Connection | None = None) -> ToolResult:
    """The `server_died` result: the server will be restarted on the next call (its stderr's tail attached)."""
    tail = conn.stderr_tail(800).strip() if conn is not None else ""
    details: dict[str, Any] = {"restart_on_next_call": True}
    if tail:
        details["stderr_tail"] = tail
    return ToolResult.error(
        "server_died",
        message + "; it will be restarted on the next call",
        tool=spec.name,
        server=spec.server,
        arguments=arguments,
        details=details,
        latency_s=time.perf_counter() - started,
    )


def check_timeout(timeout: object) -> None:
    """A timeout is a number of seconds over 0 (or None: the default); anything else is the caller's mistake."""
    if timeout is not None and not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
        raise UserError(f"timeout must be a number of seconds greater than 0, not {timeout!r}")


def _is_transport_failure(exc: Exception) -> bool:
    """httpx/httpx2 transport errors (connection refused, reset) without importing either."""
    return any(cls.__name__ in {"TransportError", "ConnectError", "RemoteProtocolError", "ReadError", "WriteError"}
               for cls in type(exc).__mro__)
