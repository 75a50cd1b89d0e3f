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

import logging
from contextlib import AsyncExitStack

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp import Client
from mcp.client import IncomingMessage
from mcp.client.caching import CacheConfig, InMemoryResponseCacheStore
from mcp.shared.exceptions import MCPError
from mcp.types import ToolListChangedNotification
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from envace_mcp._text import visible
from envace_mcp.errors import EnvaceError
from envace_mcp.toolbox._listing import bounded_output_checks, list_tools
from envace_mcp.toolbox._stderr import StderrTail
from envace_mcp.toolbox._transport import describe, implementation, open_client
from envace_mcp.toolbox.asking import LegacyQuestions, stop_at_questions
from envace_mcp.toolbox.catalog import ToolSpec
from envace_mcp.toolbox.config import ServerSpec, StdioServer
from envace_mcp.toolbox.tasks import TasksClient

logger = logging.getLogger(__name__)

_CACHE_ENTRIES = 16
"""A connection caches its own listings only (tools/list's first page, per protocol era)."""


class ServerStartError(EnvaceError):
    """A configured server could not be started or did not answer its tool listing."""


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
                    raise self._start_error(f"failed to start: {describe(exc)}") from exc
                self._mode = "legacy"
                why = describe(exc).splitlines()[0][:200]
                try:
                    await self._start_once(task_group)
                except Exception as again:
                    raise self._start_error(f"claimed protocol {claimed} in server/discover, then failed its "
                                            f"listing ({why}), and the initialize handshake failed too: "
                                            f"{describe(again)}") from again
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
                    tools, denied, problems = await list_tools(client, self.name, self.spec)
            except (MCPError, TimeoutError, ValueError, RuntimeError) as exc:
                logger.warning("MCP server %r: re-listing its tools failed, the previous listing stays: %s",
                               self.name, describe(exc))
                return
            except Exception as exc:
                self.mark_dead(generation, f"re-listing failed: {describe(exc)}")
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
                bounded_output_checks(client, lambda: self.tools)
                stop_at_questions(client)
                self.protocol_version = self._negotiated = client.protocol_version
                self._phase = f"tools/list (protocol {client.protocol_version} negotiated)"
                self._changed = anyio.Event()
                tools, denied, problems = await list_tools(client, self.name, self.spec)
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
            self.mark_dead(generation, f"session ended: {describe(exc)}")
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
                        "on the next re-list", self.name, describe(exc))

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, ToolListChangedNotification):  # the SDK evicted the cached listing first
            self._changed.set()

    def _client(self, stack: AsyncExitStack) -> Client:
        return open_client(self.spec, stack, stderr=self._stderr.writer if self._stderr is not None else None,
                           client_info=implementation(self.client_name), mode=self._mode, cache=self._cache,
                           message_handler=self._on_message, elicitation_callback=self.questions,
                           # tasks extension: task handles are polled to their result (tasks.py)
                           extensions=[TasksClient()])
