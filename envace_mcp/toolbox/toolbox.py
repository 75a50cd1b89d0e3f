"""The toolbox: many MCP servers behind one catalog, with validation, timeouts and restarts.

    async with Toolbox({"mcpServers": {...}}) as toolbox:
        result = await toolbox.call("get_balance", {"account_id": "CHK-1"})

Every call returns a `ToolResult`; failures are results with an `error_kind`, never exceptions.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup
from anyio.from_thread import start_blocking_portal
from langchain_core.tools import BaseTool

from envace_mcp.errors import UserError
from envace_mcp.toolbox import _calling, asking
from envace_mcp.toolbox._assembly import CatalogAssembly
from envace_mcp.toolbox._calling import check_timeout
from envace_mcp.toolbox._connection import Connection, ServerStartError
from envace_mcp.toolbox.backend import ToolBackend
from envace_mcp.toolbox.catalog import ToolCatalog, ToolSpec
from envace_mcp.toolbox.config import ServerSpec, load_servers
from envace_mcp.toolbox.langchain import to_langchain_tools
from envace_mcp.toolbox.result import ToolResult
from envace_mcp.toolbox.scope import ToolboxScope

DEFAULT_TIMEOUT_S = 60.0
"""Long enough for real tools (a quote service, a database), short enough that a hung tool
does not stall a GRPO batch for minutes."""
DEFAULT_STARTUP_TIMEOUT_S = 30.0
"""Start a process, initialize, list tools: seconds for a healthy server (a Python one takes ~1 s),
and a server that hangs in any of them is given up on instead of keeping the toolbox opening forever."""
_ROUTE_TRIES = 3
"""Look-ups of one call: the first, one after a restart, one after a catalog refresh; a server that keeps
dying while a call is routed fails the call instead of looping."""

_T = TypeVar("_T")


class Toolbox(ToolBackend):
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
        check_timeout(timeout)
        check_timeout(startup_timeout)
        self.specs: dict[str, ServerSpec] = load_servers(servers)
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.max_input_rounds = max_input_rounds
        self._connections = {
            name: Connection(name, spec, client_name=client_name, capture_stderr=capture_stderr,
                             startup_timeout=startup_timeout)
            for name, spec in self.specs.items()
        }
        self._assembly = CatalogAssembly(self._connections)
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
            for name, exc in failures.items():
                self._connections[name].dead_reason = f"failed to start: {exc}"
            self._assembly.build([str(exc) for exc in failures.values()])
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
            await conn.start(self._task_group())
        except ServerStartError as exc:
            failures[conn.name] = exc

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
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

    # ------------------------------------------------------------------ catalog

    @property
    def catalog(self) -> ToolCatalog:
        """Every allowed tool of every server, named as the model should call them."""
        self._require_open()
        self._assembly.refresh_moved()
        return self._assembly.catalog

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
        tools listed twice or without a name (left out), tools whose catalog name another server's tool
        holds (left out: `catalog.name_tools`), tools whose input schema is unsafe (their calls are
        refused), what the catalog's bounds cut or left out (`catalog.MAX_*`), names in a server's
        `read_only_tools` that it does not offer. Each is also logged as a warning; a restart
        that lists new problems adds them."""
        return list(self._assembly.problems)

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
        arguments: Mapping[str, Any] | None = None,
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
        check_timeout(timeout)
        if ask is not None and not self._on_own_loop():  # the asker belongs to the caller's loop
            caller, asker = asyncio.get_running_loop(), ask

            async def ask(questions: list[Any]) -> Any:
                return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(asker(questions), caller))
        return await self._on_loop(self._call(name, {} if arguments is None else arguments, timeout, meta, expect,
                                              ask=ask))

    def call_sync(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
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
        check_timeout(timeout)
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
        check_timeout(timeout)
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

    async def _on_loop(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Await `coro` on the toolbox's own loop, from it or from any other thread's loop."""
        if self._on_own_loop():
            return await coro
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _call(self, name: str, arguments: Any, timeout: float | None, meta: Mapping[str, Any] | None,
                    expect: ToolSpec | None = None, resume: asking.Resume | None = None, *,
                    ask: asking.Asker | None = None) -> ToolResult:
        started = time.perf_counter()
        catalog = self._assembly
        # Route: find the entry, bring a dead server back (which may change its listing and so the
        # catalog), and look again. The final look-up, the `expect` check, the validation and the choice
        # of session happen with no await between them: nothing can change the catalog in between.
        for _ in range(_ROUTE_TRIES):
            spec = catalog.catalog.get(name)
            if spec is None:
                catalog.refresh_moved()  # a tool a server added since the catalog was built
                spec = catalog.catalog.get(name)
            if spec is None:
                return _calling.unknown(name, arguments, expect, catalog=catalog.catalog, left_out=catalog.left_out,
                                        connections=self._connections)
            refused = _calling.refused(spec, arguments, expect)
            if refused is not None:  # no need to bring a server back to refuse a call to it
                return refused
            conn = self._connections[spec.server]
            if conn.alive and catalog.current(spec.server):
                break
            if conn.alive:
                catalog.refresh(spec.server)
                continue
            try:
                await conn.ensure(self._task_group())
            except ServerStartError as exc:
                return _calling.died(spec, arguments,
                                     f"server '{spec.server}' is down and could not be restarted: {exc}", started)
            catalog.refresh(spec.server)
        else:
            return _calling.died(spec, arguments, f"server '{spec.server}' kept restarting while the call was routed",
                                 started)
        limit = timeout if timeout is not None else (conn.spec.timeout or self.timeout)
        return await _calling.send(conn, spec, arguments, limit=limit, meta=meta, resume=resume, ask=ask,
                                   started=started)

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
        client = await self._connections[server].ensure(self._task_group())
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

    def langchain_tools(self, *, meta: Mapping[str, Any] | None = None) -> list[BaseTool]:
        """The catalog as LangChain tools (sync and async), for any existing agent."""
        return to_langchain_tools(self.scoped(meta or {}))

    # ------------------------------------------------------------------ helpers

    def _require_open(self) -> None:
        if self._stack is None:
            raise UserError("the Toolbox is not open: use `async with Toolbox(...) as toolbox:`")

    def _task_group(self) -> TaskGroup:
        assert self._tg is not None
        return self._tg

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
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(Toolbox(servers, **kwargs)) as toolbox:
        yield toolbox
