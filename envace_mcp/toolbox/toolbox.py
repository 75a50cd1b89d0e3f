"""The toolbox: many MCP servers behind one catalog, with validation, timeouts and restarts.

    async with Toolbox({"mcpServers": {...}}) as toolbox:
        result = await toolbox.call("get_balance", {"account_id": "CHK-1"})

Every call returns a `ToolResult`; failures are results with an `error_kind`, never exceptions.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED
from pydantic import ValidationError

from envace_mcp._text import visible
from envace_mcp.errors import UserError
from envace_mcp.toolbox import asking, tasks
from envace_mcp.toolbox._connection import Connection, ServerStartError, _describe
from envace_mcp.toolbox.catalog import ToolCatalog, ToolSpec, bound_catalog, name_tools
from envace_mcp.toolbox.config import ServerSpec, load_servers
from envace_mcp.toolbox.result import ToolResult
from envace_mcp.toolbox.scope import ToolboxScope, tool_changed

DEFAULT_TIMEOUT_S = 60.0
"""Long enough for real tools (a quote service, a database), short enough that a hung tool
does not stall a GRPO batch for minutes."""
DEFAULT_STARTUP_TIMEOUT_S = 30.0
"""Start a process, initialize, list tools: seconds for a healthy server (a Python one takes ~1 s),
and a server that hangs in any of them is given up on instead of keeping the toolbox opening forever."""
_ROUTE_TRIES = 3
"""Look-ups of one call: the first, one after a restart, one after a catalog refresh; a server that keeps
dying while a call is routed fails the call instead of looping."""

logger = logging.getLogger(__name__)

_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    EOFError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


class Toolbox:
    """Persistent sessions to every configured MCP server, one catalog, results as data.

    Args:
        servers: a path to an `mcpServers` JSON file, or a mapping in that shape; values may also
            be in-process server objects (`MCPServer`), which is how tests run servers fast.
        timeout: default per-call timeout in seconds (a server's own `timeout` wins).
        startup_timeout: seconds each server has to start and list its tools (its own
            `startup_timeout` wins). A server that fails is reported in `problems` and left out,
            unless it is `required` or no server starts at all: then opening fails.
        capture_stderr: write stdio servers' stderr to a log file (its tail is quoted in
            `server_died` errors) instead of this process's stderr.
        max_input_rounds: rounds of questions one call may ask (`respond`) before it ends as an error.
    """

    def __init__(
        self,
        servers: str | Path | Mapping[str, Any],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
        capture_stderr: bool = True,
        client_name: str = "envace-mcp",
        max_input_rounds: int = asking.MAX_INPUT_ROUNDS,
    ) -> None:
        _check_timeout(timeout)
        _check_timeout(startup_timeout)
        self.specs: dict[str, ServerSpec] = load_servers(servers)
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.max_input_rounds = max_input_rounds
        self._problems: list[str] = []
        self._connections = {
            name: Connection(name, spec, client_name=client_name, capture_stderr=capture_stderr,
                             startup_timeout=startup_timeout)
            for name, spec in self.specs.items()
        }
        self._catalog = ToolCatalog([])
        self._built_from: dict[str, int] = {}
        """Each server's connection generation the catalog was built from (a restart may change its listing)."""
        self._left_out: dict[str, str] = {}
        """Catalog names left out by the catalog's bounds, with why (what a call to one of them says)."""
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Toolbox:
        if self._stack is not None:
            raise UserError("this Toolbox is already open")
        stack = AsyncExitStack()
        try:
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            stack.push_async_callback(self._stop_all)
            failures: dict[str, ServerStartError] = {}
            async with anyio.create_task_group() as starting:
                for conn in self._connections.values():
                    starting.start_soon(self._start, conn, failures)
            fatal = [failures[n] for n in failures if self.specs[n].required]
            if fatal or (failures and len(failures) == len(self._connections)):
                raise (fatal or list(failures.values()))[0]
            self._problems = [str(exc) for exc in failures.values()]
            for name, exc in failures.items():
                self._connections[name].dead_reason = f"failed to start: {exc}"
            bounds = self._rebuild_catalog()
            self._problems += [p for conn in self._connections.values() for p in conn.problems] + bounds
            for problem in self._problems:
                logger.warning("%s", visible(problem, newlines=True))  # logging prints as it gets
        except BaseException as exc:
            # Tear down without handing `exc` to our task group: it would re-raise it wrapped in
            # an ExceptionGroup, and callers should see the error they caused.
            await stack.__aexit__(None, None, None)
            self._close_logs()
            self._tg = None
            if isinstance(exc, BaseExceptionGroup) and all(isinstance(e, ServerStartError) for e in exc.exceptions):
                raise exc.exceptions[0] from None
            raise
        self._stack = stack
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        return self

    async def _start(self, conn: Connection, failures: dict[str, ServerStartError]) -> None:
        """Start one server (under its start-up deadline); a failure is recorded, not raised."""
        try:
            await conn.start(self._tg)  # type: ignore[arg-type]
        except ServerStartError as exc:
            failures[conn.name] = exc

    async def __aexit__(self, *exc_info: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            try:
                # The caller's exception (or Ctrl-C) propagates by itself once we return; the
                # connections are stopped either way (shielded), so no server outlives the toolbox.
                await stack.__aexit__(None, None, None)
            finally:
                self._close_logs()
                self._tg = None

    async def _stop_all(self) -> None:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for conn in self._connections.values():
                    tg.start_soon(conn.stop)

    def _close_logs(self) -> None:
        for conn in self._connections.values():
            conn.close_log()

    def _rebuild_catalog(self) -> list[str]:
        """Name every server's tools and keep what fits the catalog's bounds; returns what was left out."""
        kept, self._left_out, problems = bound_catalog(
            name_tools({n: c.tools for n, c in self._connections.items()}).values())
        self._catalog = ToolCatalog(kept)
        self._built_from = {n: c.generation for n, c in self._connections.items()}
        return problems

    def _refresh(self, server: str) -> None:
        """Bring the catalog up to date with a server that restarted since it was built."""
        conn = self._connections[server]
        if self._built_from.get(server) != conn.generation:
            problems = self._rebuild_catalog()
            for problem in [*conn.problems, *problems]:
                if problem not in self._problems:
                    logger.warning("%s", visible(problem, newlines=True))  # logging prints as it gets
                    self._problems.append(problem)

    # ------------------------------------------------------------------ catalog

    def _refresh_moved(self) -> None:
        """Rebuild the catalog for live servers whose listing changed since (a restart, or a re-list after
        the server said its tools changed)."""
        for server, conn in self._connections.items():
            if conn.alive and self._built_from.get(server) != conn.generation:
                self._refresh(server)

    @property
    def catalog(self) -> ToolCatalog:
        """Every allowed tool of every server, named as the model should call them."""
        self._require_open()
        self._refresh_moved()
        return self._catalog

    def protocol(self, server: str) -> str | None:
        """The protocol revision `server`'s session negotiated: "2026-07-28" for a stateless server,
        a 2025 revision for one that needed the initialize handshake; None while it is down."""
        return self._connections[server].protocol_version

    @property
    def servers(self) -> list[str]:
        return list(self._connections)

    @property
    def problems(self) -> list[str]:
        """What went wrong while opening, without stopping it: servers that did not start (left out),
        tools listed twice or without a name (left out), tools whose input schema is unsafe (their
        calls are refused), what the catalog's bounds cut or left out (`catalog.MAX_*`), names in a
        server's `read_only_tools` that it does not offer. Each is also logged as a warning; a restart
        that lists new problems adds them."""
        return list(self._problems)

    def restarts(self, server: str) -> int:
        """How many times `server` was restarted after dying."""
        return self._connections[server].restarts

    def server_log(self, server: str) -> str:
        """The tail of a stdio server's captured stderr."""
        return self._connections[server].stderr_tail()

    # ------------------------------------------------------------------ calls

    async def call(
        self,
        name: str,
        arguments: Any = None,
        *,
        timeout: float | None = None,
        meta: Mapping[str, Any] | None = None,
        expect: ToolSpec | None = None,
        ask: asking.Asker | None = None,
    ) -> ToolResult:
        """Call a tool by its catalog name. Never raises for tool, server or argument failures.

        `meta` travels as the request's `_meta` (the bundled servers read their episode key there).
        `expect`: the catalog entry the call was judged by (gated, approved). The call runs only if the
        live entry for `name` is still that tool — same server, remote tool, annotations and schemas —
        checked in the same step that picks the server's session; otherwise it is not run and the
        result is a `tool_changed` error (a server that restarted with another listing can otherwise
        turn an approved read-only name into another server's destructive tool).
        `ask`: answers questions a 2025-era server sends in the middle of the call (`elicitation/create`),
        run on the caller's loop (`asking.LegacyQuestions`); without it they are refused. A 2026 server's
        questions come back as a waiting result instead (`respond`).
        Safe to call from any thread or event loop: calls are carried to the toolbox's own loop.
        """
        self._require_open()
        _check_timeout(timeout)
        if ask is not None and not self._on_own_loop():  # the asker belongs to the caller's loop
            caller, asker = asyncio.get_running_loop(), ask

            async def ask(questions: list[Any]) -> Any:
                return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(asker(questions), caller))
        return await self._on_loop(self._call(name, {} if arguments is None else arguments, timeout, meta, expect,
                                              ask=ask))

    def call_sync(
        self,
        name: str,
        arguments: Any = None,
        *,
        timeout: float | None = None,
        meta: Mapping[str, Any] | None = None,
        expect: ToolSpec | None = None,
    ) -> ToolResult:
        """Blocking `call` for synchronous code running outside the toolbox's event loop thread."""
        self._require_open()
        if threading.get_ident() == self._thread:
            raise UserError(
                "call_sync() was called on the toolbox's own event-loop thread, where blocking would deadlock; "
                "use `await toolbox.call(...)` there, or open the toolbox with `blocking_toolbox()`"
            )
        assert self._loop is not None
        _check_timeout(timeout)
        coro = self._call(name, {} if arguments is None else arguments, timeout, meta, expect)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def respond(
        self,
        waiting: ToolResult,
        answers: Mapping[str, Any],
        *,
        timeout: float | None = None,
        meta: Mapping[str, Any] | None = None,
        expect: ToolSpec | None = None,
        max_rounds: int | None = None,
    ) -> ToolResult:
        """Continue a call whose server asked (`waiting.error_kind == "input_required"`) with `answers`, one
        per question key (`asking.Answer`: accept with content, decline, cancel). The server gets the call
        again with the answers and its own state; the result is the call's, or its next questions. A server
        still asking after `max_rounds` rounds (default: the toolbox's `max_input_rounds`) ends the call
        with an error. Answers that do not fit the questions raise `UserError` and send nothing, so the
        same `waiting` result can be answered again."""
        self._require_open()
        _check_timeout(timeout)
        if waiting.input_required is None:
            raise UserError(f"the result of tool {waiting.tool!r} is not waiting for answers")
        pending = waiting.input_required
        try:
            checked = asking.read_answers(pending["questions"], answers)
        except asking.AskingError as exc:
            raise UserError(f"answers to tool {waiting.tool!r}: {exc}") from None
        resume = asking.Resume(checked, pending["request_state"], pending["round"],
                               max_rounds if max_rounds is not None else self.max_input_rounds)
        return await self._on_loop(self._call(waiting.tool, waiting.arguments, timeout, meta, expect, resume))

    async def _on_loop(self, coro: Any) -> Any:
        """Await `coro` on the toolbox's own loop, from it or from any other thread's loop."""
        if self._on_own_loop():
            return await coro
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _call(self, name: str, arguments: Any, timeout: float | None, meta: Mapping[str, Any] | None,
                    expect: ToolSpec | None = None, resume: asking.Resume | None = None, *,
                    ask: asking.Asker | None = None) -> ToolResult:
        started = time.perf_counter()
        # Route: find the entry, bring a dead server back (which may change its listing and so the
        # catalog), and look again. The final look-up, the `expect` check, the validation and the choice
        # of session happen with no await between them: nothing can change the catalog in between.
        for _ in range(_ROUTE_TRIES):
            spec = self._catalog.get(name)
            if spec is None:
                self._refresh_moved()  # a tool a server added since the catalog was built
                spec = self._catalog.get(name)
            if spec is None:
                return self._unknown(name, arguments, expect)
            refused = self._refused(spec, arguments, expect)
            if refused is not None:  # no need to bring a server back to refuse a call to it
                return refused
            conn = self._connections[spec.server]
            if conn.alive and self._built_from.get(spec.server) == conn.generation:
                break
            if conn.alive:
                self._refresh(spec.server)
                continue
            try:
                await conn.ensure(self._tg)  # type: ignore[arg-type]
            except ServerStartError as exc:
                return self._died(spec, arguments, f"server '{spec.server}' is down and could not be restarted: {exc}",
                                  started)
            self._refresh(spec.server)
        else:
            return self._died(spec, arguments, f"server '{spec.server}' kept restarting while the call was routed",
                              started)
        client = conn.client
        assert client is not None and self._tg is not None
        generation = conn.generation
        limit = timeout if timeout is not None else (conn.spec.timeout or self.timeout)

        def failed(kind: Any, message: str, **details: Any) -> ToolResult:
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
                return self._died(spec, arguments, f"server '{spec.server}' died during the call", started, conn)
            asked = mid_call.note(spec.server)  # a 2025 server that asked mid-call, refused, and failed for it
            return failed("tool_error", f"Tool '{name}' failed with a protocol error {exc.code}: {exc}"
                          + (f"\n{asked}" if asked else ""), code=exc.code)
        except _TRANSPORT_ERRORS as exc:
            conn.mark_dead(generation, _describe(exc))
            return self._died(spec, arguments, f"server '{spec.server}' is unreachable: {_describe(exc)}", started, conn)
        except (ValidationError, RuntimeError, ValueError) as exc:
            return failed("tool_error", f"Tool '{name}' returned a malformed result: {_describe(exc)}")
        except Exception as exc:
            if _is_transport_failure(exc):
                conn.mark_dead(generation, _describe(exc))
                return self._died(spec, arguments, f"server '{spec.server}' is unreachable: {_describe(exc)}", started, conn)
            return watch.attach(failed("tool_error", f"Tool '{name}' failed: {_describe(exc)}"))
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

    def _refused(self, spec: ToolSpec, arguments: Any, expect: ToolSpec | None) -> ToolResult | None:
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

    def _unknown(self, name: str, arguments: Any, expect: ToolSpec | None = None) -> ToolResult:
        if expect is not None:
            return tool_changed(name, arguments, expect, None)
        if name in self._left_out:
            return ToolResult.error("unknown_tool",
                                    f"Tool '{name}' was left out of the catalog: {self._left_out[name]}",
                                    tool=name, arguments=arguments, details={"available": self._catalog.names})
        for server, conn in self._connections.items():
            if name in conn.denied:
                return ToolResult.error(
                    "denied",
                    f"Tool '{name}' is not allowed by the configuration of server '{server}'",
                    tool=name,
                    server=server,
                    arguments=arguments,
                )
        close = difflib.get_close_matches(name, self._catalog.names, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return ToolResult.error(
            "unknown_tool",
            f"Unknown tool '{name}'{hint}",
            tool=name,
            arguments=arguments,
            details={"available": self._catalog.names},
        )

    def _died(
        self, spec: ToolSpec, arguments: Any, message: str, started: float, conn: Connection | None = None
    ) -> ToolResult:
        tail = conn.stderr_tail(800).strip() if conn is not None else ""
        details = {"restart_on_next_call": True}
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

    # ------------------------------------------------------------------ other views

    async def read_resource(self, server: str, uri: str, *, meta: Mapping[str, Any] | None = None) -> str:
        """The text of a resource on one server (bypassing the client-side cache)."""
        self._require_open()
        if server not in self._connections:
            raise UserError(f"unknown server {server!r}; configured: {', '.join(self._connections)}")
        if not self._on_own_loop():
            assert self._loop is not None
            fut = asyncio.run_coroutine_threadsafe(self.read_resource(server, uri, meta=meta), self._loop)
            return await asyncio.wrap_future(fut)
        assert self._tg is not None
        client = await self._connections[server].ensure(self._tg)
        result = await client.read_resource(uri, meta=dict(meta) if meta else None, cache_mode="bypass")
        return "".join(getattr(c, "text", "") or "" for c in result.contents)

    def scoped(self, meta: Mapping[str, Any] | None = None, *, bind: Mapping[str, Any] | None = None,
               hide: Iterable[str] = ()) -> ToolboxScope:
        """A view for one episode or tenant.

        - `meta`: sent as every call's `_meta` (the bundled servers read their episode key there);
        - `bind`: arguments fixed for every call of every tool that declares them (servers such as the
          τ² ones take a `state_key` argument): removed from the schemas the model sees, and always
          set by the scope — a value the model writes for them is overwritten, never trusted;
        - `hide`: catalog names the view neither lists nor calls (a benchmark's control tools).
        """
        return ToolboxScope(self, dict(meta or {}), bind=dict(bind or {}), hide=frozenset(hide))

    def langchain_tools(self, *, meta: Mapping[str, Any] | None = None) -> list[Any]:
        """The catalog as LangChain tools (sync and async), for any existing agent."""
        from envace_mcp.toolbox.langchain import to_langchain_tools

        return to_langchain_tools(self.scoped(meta or {}))

    # ------------------------------------------------------------------ helpers

    def _require_open(self) -> None:
        if self._stack is None:
            raise UserError("the Toolbox is not open: use `async with Toolbox(...) as toolbox:`")

    def _on_own_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False


@contextmanager
def blocking_toolbox(servers: str | Path | Mapping[str, Any], **kwargs: Any) -> Iterator[Toolbox]:
    """Open a Toolbox on a background event-loop thread, for synchronous programs.

    Use `toolbox.call_sync(...)` (or the LangChain tools' `invoke`) from the calling thread.
    """
    from anyio.from_thread import start_blocking_portal

    with start_blocking_portal() as portal, portal.wrap_async_context_manager(Toolbox(servers, **kwargs)) as toolbox:
        yield toolbox


def _check_timeout(timeout: Any) -> None:
    if timeout is not None and not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
        raise UserError(f"timeout must be a number of seconds greater than 0, not {timeout!r}")


def _is_transport_failure(exc: Exception) -> bool:
    """httpx/httpx2 transport errors (connection refused, reset) without importing either."""
    return any(cls.__name__ in {"TransportError", "ConnectError", "RemoteProtocolError", "ReadError", "WriteError"}
               for cls in type(exc).__mro__)
