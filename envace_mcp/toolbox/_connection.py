"""One persistent MCP session per server, owned by a long-lived task, restarted when it dies.

anyio cancel scopes must be entered and left by the same task, and the SDK's stdio transport
keeps a task group open for the session's lifetime. So each connection lives in an *owner task*
in the toolbox's task group: it enters `mcp.Client`, publishes the session, and waits for a stop
signal. Calls from any task use the published session (requests are multiplexed by id).

Both protocol eras share this path. The SDK's `mode="auto"` probes `server/discover` and falls back
to the `initialize` handshake; a 2026-07-28 server is then spoken to statelessly (no handshake, no
session id, each request carries its own `_meta` envelope). What the era changes here:
- listings carry caching hints (`ttlMs`): each connection keeps one response cache for its whole
  life, so a restart or a re-list inside the server's TTL is answered from it, and a
  `tools/list_changed` (a notification on a handshake-era session, a `subscriptions/listen` event
  on a 2026 one) evicts it and re-lists at once;
- a server whose discover answer claims 2026-07-28 but which then refuses 2026 requests is
  reconnected once with the handshake (`Connection.problems` says so); discover answers the SDK
  cannot read already fall back to the handshake in the SDK.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import threading
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import IO, Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp import Client, StdioServerParameters
from mcp.client.caching import CacheConfig, InMemoryResponseCacheStore
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp.types import ToolListChangedNotification
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from envace_mcp._text import visible
from envace_mcp.errors import EnvaceError
from envace_mcp.toolbox.asking import LegacyQuestions, stop_at_questions
from envace_mcp.toolbox.catalog import ToolAnnotations, ToolSpec, bound_tool
from envace_mcp.toolbox.config import HttpServer, InProcessServer, ServerSpec, StdioServer
from envace_mcp.toolbox.tasks import TasksClient

logger = logging.getLogger(__name__)

_LIST_PAGE_CAP = 100
"""A paginator that never ends must not hang start-up."""
_CACHE_ENTRIES = 16
"""A connection caches its own listings only (tools/list's first page, per protocol era)."""


class ServerStartError(EnvaceError):
    """A configured server could not be started or did not answer its tool listing."""


class StderrTail:
    """A stdio server's stderr, kept as its last `limit` bytes: the child writes into a pipe that a
    thread drains, so a server printing without end costs a bounded buffer, and nothing is left on
    disk. (A capture file grew without limit, and reading its tail loaded all of it.)"""

    LIMIT = 64 * 1024

    def __init__(self, name: str, limit: int = LIMIT) -> None:
        read, write = os.pipe()
        self.writer: IO[str] = os.fdopen(write, "w")
        """Given to each (re)started process as its stderr."""
        self.limit = limit
        self.total = 0
        """Bytes the server has written to stderr, kept or not."""
        self._read = read
        self._buffer = bytearray()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._pump, name=f"envace-stderr-{name}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while not self._stopped.is_set():
            ready, _, _ = select.select([self._read], [], [], 0.1)
            if not ready:
                continue
            try:
                chunk = os.read(self._read, 1 << 16)
            except OSError:
                return
            if not chunk:  # every writer closed: the toolbox is closing
                return
            with self._lock:
                self.total += len(chunk)
                self._buffer += chunk
                if len(self._buffer) > self.limit:
                    del self._buffer[: len(self._buffer) - self.limit]

    def tail(self, limit: int = 2000) -> str:
        """The last `limit` characters, once what the server already wrote has been read (≤ 0.1 s)."""
        deadline = time.monotonic() + 0.1
        while not self._stopped.is_set() and time.monotonic() < deadline:
            if not select.select([self._read], [], [], 0)[0]:
                break
            time.sleep(0.002)
        with self._lock:
            return bytes(self._buffer[-limit * 4:]).decode("utf-8", errors="replace")[-limit:]

    def close(self) -> None:
        self._stopped.set()
        self.writer.close()
        self._thread.join(timeout=1.0)
        try:
            os.close(self._read)
        except OSError:
            pass


class Connection:
    """The live session to one server, plus what is needed to bring it back after a death."""

    def __init__(self, name: str, spec: ServerSpec, *, client_name: str, capture_stderr: bool,
                 startup_timeout: float) -> None:
        self.name = name
        self.spec = spec
        self.startup_timeout = spec.startup_timeout or startup_timeout
        """Seconds for every (re)start: spawn, initialize, list tools."""
        self.client_name = client_name
        self.generation = 0
        """Bumped on every (re)start; a failure only kills the generation it happened on."""
        self.restarts = 0
        self.client: Client | None = None
        self.questions = LegacyQuestions()
        """Declares that this client asks people (elicitation), and handles mid-call questions (toolbox.asking)."""
        self.protocol_version: str | None = None
        """The revision the live session negotiated (`2026-07-28`: stateless; a `2025-*` one: the
        initialize handshake); `None` while no session is up."""
        self.tools: list[ToolSpec] = []
        self.denied: set[str] = set()
        """Tools the server offers that the config's allow/deny lists exclude."""
        self.dead_reason: str | None = None
        self.problems: list[str] = []
        """What was wrong with the server's tool listing (duplicate or empty names, unusable schemas)."""
        self._stop: anyio.Event | None = None
        self._done: anyio.Event | None = None
        self._lock = anyio.Lock()
        self._session_start = 0
        """The generation the live session started at: re-lists bump `generation` on the same session."""
        self._mode = "auto"
        """How the next session negotiates: "legacy" once the server lied about speaking 2026-07-28."""
        self._negotiated: str | None = None
        """The revision the latest session negotiated, kept after it fails (`protocol_version` is not)."""
        self._phase = "server/discover or initialize"
        """What the start in progress waits for (named when it times out)."""
        self._changed = anyio.Event()
        """Set when the server says its tool list changed; the owner task re-lists."""
        self._listing_lock = anyio.Lock()
        # One cache for every session of this server: a restart inside the listing's TTL is served
        # from it. Its own store, so nothing is shared with another server or toolbox.
        self._cache = CacheConfig(store=InMemoryResponseCacheStore(max_entries=_CACHE_ENTRIES), partition=name,
                                  target_id=name)
        self._stderr: StderrTail | None = StderrTail(name) if capture_stderr and isinstance(spec, StdioServer) else None

    @property
    def alive(self) -> bool:
        return self.client is not None and self.dead_reason is None

    def stderr_tail(self, limit: int = 2000) -> str:
        """The end of the server's stderr (stdio servers only), for error messages."""
        return self._stderr.tail(limit) if self._stderr is not None else ""

    async def start(self, task_group: TaskGroup) -> None:
        """Start the owner task and wait, at most `startup_timeout`, until the session is up and its tools
        are listed; the first start and every restart alike. A server that negotiated 2026-07-28 and then
        failed its listing is tried once more with the initialize handshake (see the module docstring)."""
        with anyio.move_on_after(self.startup_timeout) as deadline:
            try:
                await self._start_once(task_group)
            except Exception as exc:
                claimed = self._negotiated
                if self._mode != "auto" or claimed not in MODERN_PROTOCOL_VERSIONS:
                    raise self._start_error(f"failed to start: {_describe(exc)}") from exc
                self._mode = "legacy"
                why = _describe(exc).splitlines()[0][:200]
                try:
                    await self._start_once(task_group)
                except Exception as again:
                    raise self._start_error(f"claimed protocol {claimed} in server/discover, then failed its "
                                            f"listing ({why}), and the initialize handshake failed too: "
                                            f"{_describe(again)}") from again
                self.problems.insert(0, f"server {self.name!r} claimed protocol {claimed} in server/discover but "
                                        f"refused a {claimed} request ({why}); connected with the initialize "
                                        f"handshake ({self.protocol_version}) instead")
        if deadline.cancelled_caught:
            raise self._start_error(f"did not start within {self.startup_timeout:g} s (no answer to {self._phase})")

    async def _start_once(self, task_group: TaskGroup) -> None:
        self.generation += 1
        self._session_start = self.generation
        self.dead_reason = None
        self.protocol_version = self._negotiated = None
        self._phase = "initialize" if self._mode == "legacy" else "server/discover or initialize"
        await task_group.start(self._own, self.generation)

    def _start_error(self, why: str) -> ServerStartError:
        tail = visible(self.stderr_tail().strip(), newlines=True)
        return ServerStartError(f"MCP server {self.name!r} {why}" + (f"\n--- server stderr ---\n{tail}" if tail else ""))

    async def ensure(self, task_group: TaskGroup) -> Client:
        """The live client, restarting the server first if an earlier call saw it die."""
        if self.alive:
            assert self.client is not None
            return self.client
        async with self._lock:
            if not self.alive:
                await self.stop()
                self.restarts += 1
                logger.info("restarting MCP server %r (%s)", self.name, self.dead_reason)
                await self.start(task_group)
        assert self.client is not None
        return self.client

    def mark_dead(self, generation: int, reason: str) -> None:
        """Record that the session failed; `generation` is the one the failing call saw, so a failure
        of an older session (already restarted) changes nothing."""
        if generation >= self._session_start and self.dead_reason is None:
            self.dead_reason = reason

    async def relist(self) -> None:
        """List the tools again on the live session and bump `generation` (the toolbox rebuilds its
        catalog from the new listing). Within a 2026 server's `ttlMs` the listing comes from the cache,
        not the server; after a list-changed signal the cache was evicted and it is fetched. A listing
        that fails keeps the previous one (logged); a dead transport marks the session dead."""
        client, generation = self.client, self.generation
        if client is None:
            return
        async with self._listing_lock:
            try:
                with anyio.fail_after(self.startup_timeout):
                    tools, denied, problems = await _list_tools(client, self.name, self.spec)
            except (MCPError, TimeoutError, ValueError, RuntimeError) as exc:
                logger.warning("MCP server %r: re-listing its tools failed, the previous listing stays: %s",
                               self.name, _describe(exc))
                return
            except Exception as exc:
                self.mark_dead(generation, f"re-listing failed: {_describe(exc)}")
                return
            if self.client is client:
                self.tools, self.denied, self.problems = tools, denied, problems
                self.generation += 1

    async def stop(self) -> None:
        """Ask the owner task to leave the session and wait for it (bounded by the SDK's shutdown)."""
        if self._stop is not None and self._done is not None:
            self._stop.set()
            with anyio.CancelScope(shield=True):
                await self._done.wait()
        self._stop = self._done = None

    def close_log(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    async def _own(self, generation: int, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        stop, done = anyio.Event(), anyio.Event()
        self._stop, self._done = stop, done
        started = False
        try:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(self._client(stack))
                _bounded_output_checks(client, self)
                stop_at_questions(client)
                self.protocol_version = self._negotiated = client.protocol_version
                self._phase = f"tools/list (protocol {client.protocol_version} negotiated)"
                self._changed = anyio.Event()
                tools, denied, problems = await _list_tools(client, self.name, self.spec)
                self.client, self.tools, self.denied, self.problems = client, tools, denied, problems
                started = True
                task_status.started()
                async with anyio.create_task_group() as follow:
                    follow.start_soon(self._follow_changes, client)
                    await stop.wait()
                    follow.cancel_scope.cancel()
        except Exception as exc:
            if not started:
                raise
            self.mark_dead(generation, f"session ended: {_describe(exc)}")
        finally:
            if self._session_start == generation:
                self.client = None
                self.protocol_version = None
            done.set()

    async def _follow_changes(self, client: Client) -> None:
        """Re-list whenever the server says its tool list changed. A 2026 server says so only on a
        `subscriptions/listen` stream, opened when its capabilities offer tools.listChanged; a
        handshake-era one sends a notification (`_on_message`)."""
        async with anyio.create_task_group() as tg:
            tools = client.server_capabilities.tools
            if client.protocol_version in MODERN_PROTOCOL_VERSIONS and tools is not None and tools.list_changed:
                tg.start_soon(self._listen, client)
            while True:
                await self._changed.wait()
                self._changed = anyio.Event()
                await self.relist()

    async def _listen(self, client: Client) -> None:
        try:
            async with client.listen(tools_list_changed=True) as events:
                async for _ in events:  # the SDK has evicted the cached listing before this wakes
                    self._changed.set()
        except Exception as exc:  # noqa: BLE001 - without the stream the listing just waits for its TTL
            logger.info("MCP server %r: its subscriptions/listen stream ended (%s); tool changes are picked up "
                        "on the next re-list", self.name, _describe(exc))

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):  # the SDK evicted the cached listing first
            self._changed.set()

    def _client(self, stack: AsyncExitStack) -> Client:
        options: dict[str, Any] = {"client_info": _implementation(self.client_name), "mode": self._mode,
                                   "cache": self._cache, "message_handler": self._on_message,
                                   "elicitation_callback": self.questions,
                                   # tasks extension: task handles are polled to their result (tasks.py)
                                   "extensions": [TasksClient()]}
        spec = self.spec
        if isinstance(spec, InProcessServer):
            return Client(spec.server, **options)
        if isinstance(spec, StdioServer):
            # "replace": one byte that is not UTF-8 on the server's stdout otherwise kills the SDK's reader,
            # and every later call on the session times out with nothing said
            params = StdioServerParameters(command=spec.command, args=spec.args, env=spec.env, cwd=spec.cwd,
                                           encoding_error_handler="replace")
            errlog: Any = self._stderr.writer if self._stderr is not None else _stderr_stream()
            return Client(_answering_unreadable(stdio_client(params, errlog=errlog)), **options)
        assert isinstance(spec, HttpServer)
        if not spec.headers:
            return Client(spec.url, **options)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers=spec.headers, timeout=httpx2.Timeout(30.0, read=300.0))
        stack.push_async_callback(http.aclose)
        return Client(streamable_http_client(spec.url, http_client=http), **options)


def _bounded_output_checks(client: Client, conn: Connection) -> None:
    """The SDK checks a result's structuredContent against the tool's output schema itself, with plain
    jsonschema: no time bound on `pattern`, `uniqueItems` pair by pair. A hostile schema and result held
    the event loop every server shares for seconds to hours, past any call's timeout. The same check
    runs here through the toolbox's bounded validator (`validation.SchemaValidator`), on the schema of
    the listing the catalog holds; errors reach the caller as a malformed result, as the SDK's did."""

    async def validate_tool_result(name: str, result: Any) -> None:
        spec = next((tool for tool in conn.tools if tool.remote_name == name), None)
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


async def _list_tools(client: Client, server: str, spec: ServerSpec) -> tuple[list[ToolSpec], set[str], list[str]]:
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


def _annotations(spec: ServerSpec, tool: Any) -> ToolAnnotations:
    """A tool's annotations under its server's trust settings: the user's `read_only_tools` first, then
    the server's hints where they are trusted, else the spec's defaults (destructive)."""
    title = getattr(tool.annotations, "title", None)
    if tool.name in spec.read_only_tools:
        return ToolAnnotations.untrusted(read_only=True, title=title)
    if not spec.trust_annotations:
        return ToolAnnotations.untrusted(title=title)
    return ToolAnnotations.from_hints(tool.annotations)


@asynccontextmanager
async def _answering_unreadable(transport: Any) -> AsyncIterator[Any]:
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


def _error_reply(exc: Exception) -> Any:
    """A JSON-RPC error answering the reply that failed to parse, when its request id can be read."""
    from mcp.shared.message import SessionMessage
    from mcp.types import PARSE_ERROR, ErrorData, JSONRPCError

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


def _implementation(name: str) -> Any:
    from mcp.types import Implementation

    from envace_mcp._version import __version__

    return Implementation(name=name, version=__version__)


def _stderr_stream() -> Any:
    import sys

    return sys.stderr


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    lines = str(exc).splitlines()
    if len(lines) > 4:  # pydantic lists every invalid field of a listing: the first few say enough
        lines = [*lines[:4], f"... ({len(lines) - 4} more lines)"]
    text = visible("\n".join(lines), newlines=True)  # a server's words: logging prints them as they are
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
