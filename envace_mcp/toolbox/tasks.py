"""Long-running tools: the MCP tasks extension (`io.modelcontextprotocol/tasks`, 2026-07-28) on the client side.

A server that negotiated the extension may answer any `tools/call` with a task handle (`resultType:
"task"`) instead of the result; the client polls `tasks/get` until the task ends and reads the final
`CallToolResult` inlined there. The SDK (mcp 2.3) ships the types of the 2025-11-25 core tasks and no
implementation; its seam for this is a client extension whose `ResultClaim` finishes a claimed result
inside `Client.call_tool`. `TasksClient` is that extension: every toolbox session carries it, so a task
handle never reaches the toolbox, and the toolbox's per-call timeout covers the task's whole life.

What the server says while the task runs is untrusted: a status it made up, a task id that changes, a
status message of any size or bytes. Each ends the task (`tasks/cancel`) as an error result whose text
is bounded and escaped. A call that is cancelled (its timeout, or the graph run it belongs to) cancels
its task, shielded and bounded, before the cancellation goes on.

Not yet: answering a task's own input requests (`input_required` + `tasks/update`: the task is cancelled
with an error that says so), the 2025-11-25 core tasks (`params.task`, `tasks/result`: the SDK validates
a 2025-era `tools/call` reply as a `CallToolResult` on both sides, so a `CreateTaskResult` cannot pass),
status notifications (polling only).
"""

from __future__ import annotations

import contextvars
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import anyio
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED
from mcp_types import CallToolResult, Request, RequestParams, Result, TextContent
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envace_mcp._text import visible
from envace_mcp.toolbox.result import ToolResult

EXTENSION = "io.modelcontextprotocol/tasks"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
MAX_SAID_CHARS = 500
"""What a server's status message or task id may show in a result or trace: enough for a reason, and a
server that sends a megabyte of it cannot fill the model's context or a terminal."""
MAX_STATUSES = 32
"""Status changes kept in a task's life: a task that flaps between states cannot grow its trace."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskPolicy:
    """How a task is polled and given up on."""

    floor_s: float = 0.05
    """Least wait between polls, whatever the server suggests: a `pollIntervalMs` of 0 cannot turn the
    toolbox into a busy loop against the server."""
    cap_s: float = 5.0
    """Longest wait between polls: a server that suggests an hour still has its task looked at while the
    call's timeout (60 s by default) runs."""
    default_s: float = 1.0
    """Wait when the server suggests none: a long-running tool's result is rarely needed sooner."""
    cancel_s: float = 2.0
    """How long `tasks/cancel` may take on the way out of a timed-out or cancelled call: the caller
    waits for it, so a server that never answers cannot hold the caller."""

    def wait(self, interval_ms: Any) -> float:
        """Seconds to wait before the next poll, from the server's suggestion (any JSON value)."""
        seconds = self.default_s
        if isinstance(interval_ms, (int, float)) and not isinstance(interval_ms, bool):
            try:  # an int past a float's range (10**400) overflows the conversion
                seconds = float(interval_ms) / 1000
            except OverflowError:
                seconds = math.inf if interval_ms > 0 else -math.inf
            if math.isnan(seconds):
                seconds = self.default_s
        return min(max(seconds, self.floor_s), self.cap_s)


class TaskLife(BaseModel):
    """What happened to one task: what the toolbox puts on the call's `ToolResult.task`, for traces."""

    task_id: str
    """Bounded and escaped: the server chose it."""
    statuses: list[tuple[str, float]] = Field(default_factory=list)
    """Each status the task went through, with seconds since it was created (the first `MAX_STATUSES`)."""
    polls: int = 0
    final_status: str | None = None
    """The terminal status the server reported; `None` when the task did not end while the call lasted."""
    cancel_sent: bool = False

    def saw(self, status: str, since: float) -> None:
        shown = _said(status)
        if (not self.statuses or self.statuses[-1][0] != shown) and len(self.statuses) < MAX_STATUSES:
            self.statuses.append((shown, round(time.monotonic() - since, 3)))


class _TaskFields(Result):
    """The `Task` fields of the extension's schema that the client reads; anything else is kept, unread."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: Any = None
    poll_interval_ms: Any = None


class CreatedTask(_TaskFields):
    """`CreateTaskResult`: the handle a server answers a `tools/call` with."""

    result_type: Literal["task"] = "task"


class TaskSnapshot(_TaskFields):
    """`GetTaskResult`: a task's state, with its final result (`completed`) or JSON-RPC error (`failed`)."""

    result: Any = None
    error: Any = None


class _TaskIdParams(RequestParams):
    task_id: str


class _GetTask(Request[_TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: _TaskIdParams
    name_param = "taskId"  # over HTTP the spec routes tasks/* by `Mcp-Name: <taskId>`


class _CancelTask(Request[_TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: _TaskIdParams
    name_param = "taskId"


class TasksClient(ClientExtension):
    """The tasks extension for `mcp.Client(extensions=[...])`: declares it on every request and polls
    each task handle a server answers with to its final `CallToolResult`."""

    identifier: ClassVar[str] = EXTENSION

    def __init__(self, policy: TaskPolicy | None = None) -> None:
        self.policy = policy or TaskPolicy()

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self._resolve)]

    async def _resolve(self, created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        watch = _watching.get()
        life = TaskLife(task_id=_said(created.task_id))
        if watch is not None:
            watch.life = life
        return await _follow(ctx.session, created, life, self.policy)


async def _follow(session: ClientSession, created: CreatedTask, life: TaskLife, policy: TaskPolicy) -> CallToolResult:
    """Poll the task to its end; every way it can end comes back as a `CallToolResult`, except the
    server's connection closing (the toolbox restarts the server) and the caller's cancellation."""
    task_id, since = created.task_id, time.monotonic()
    snapshot: _TaskFields = created
    try:
        while True:
            life.saw(snapshot.status, since)
            if snapshot.status in TERMINAL:
                life.final_status = snapshot.status
                return _ended(life, snapshot)
            why = _broken(snapshot, task_id)
            if why is not None:
                return await _give_up(session, task_id, life, policy, why)
            await anyio.sleep(policy.wait(snapshot.poll_interval_ms))
            life.polls += 1
            try:
                snapshot = await session.send_request(_GetTask(params=_TaskIdParams(task_id=task_id)), TaskSnapshot)
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    raise
                return _error(life, f"was lost: tasks/get failed with error {exc.code}: {_said(exc.message)}")
            except ValidationError as exc:
                return await _give_up(session, task_id, life, policy,
                                      f"answered tasks/get with a malformed task ({exc.error_count()} problems)")
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await _cancel(session, task_id, life, policy)
        raise


def _broken(snapshot: _TaskFields, task_id: str) -> str | None:
    """How a running task's state breaks the extension's contract (or what the toolbox cannot do yet)."""
    if snapshot.task_id != task_id:
        return f"answered tasks/get about another task '{_said(snapshot.task_id)}'"
    if snapshot.status == "input_required":
        return "asks for input inside the task, which the toolbox does not answer yet (tasks/update)"
    if snapshot.status != "working":
        return f"reported an unknown status '{_said(snapshot.status)}'"
    return None


def _ended(life: TaskLife, snapshot: _TaskFields) -> CallToolResult:
    """The final result of a `completed` task; an error result for `failed` and `cancelled`."""
    said = f": {_said(snapshot.status_message)}" if snapshot.status_message is not None else ""
    if snapshot.status == "cancelled":
        return _error(life, f"was cancelled by the server{said}")
    if snapshot.status == "failed":
        error = getattr(snapshot, "error", None)
        code = error.get("code") if isinstance(error, dict) else None
        reason = said or (f": {_said(error.get('message'))}" if isinstance(error, dict) else "")
        return _error(life, f"failed{f' with error {_said(code)}' if code is not None else ''}{reason}")
    try:
        return CallToolResult.model_validate(getattr(snapshot, "result", None), by_name=False)
    except ValidationError as exc:
        return _error(life, f"completed with a malformed result ({exc.error_count()} problems)")


async def _give_up(session: ClientSession, task_id: str, life: TaskLife, policy: TaskPolicy,
                   why: str) -> CallToolResult:
    """A server that broke the extension's contract: its task is cancelled and the call fails."""
    await _cancel(session, task_id, life, policy)
    return _error(life, f"was abandoned: the server {why}")


async def _cancel(session: ClientSession, task_id: str, life: TaskLife, policy: TaskPolicy) -> None:
    """Best effort (cancellation is cooperative in the extension): errors are logged, never raised."""
    life.cancel_sent = True
    with anyio.move_on_after(policy.cancel_s):
        try:
            await session.send_request(_CancelTask(params=_TaskIdParams(task_id=task_id)), Result)
        except Exception as exc:  # the call's own outcome is what the caller needs; this one is only logged
            logger.warning("tasks/cancel for task %s failed: %s", life.task_id, _said(str(exc)))


def _error(life: TaskLife, what: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=f"Task '{life.task_id}' {what}")], is_error=True)


def _said(value: Any) -> str:
    """Untrusted text made safe to show: at most `MAX_SAID_CHARS`, every control character escaped."""
    text = value if isinstance(value, str) else str(value)
    return visible(text[:MAX_SAID_CHARS] + ("…" if len(text) > MAX_SAID_CHARS else ""))


# ---------------------------------------------------------------------------- the toolbox's side

@dataclass
class TaskWatch:
    """The task a call created, if any (`watch()`): set by the claim while the call runs."""

    life: TaskLife | None = None

    def attach(self, result: ToolResult) -> ToolResult:
        """`result` carrying the task's life (`ToolResult.task`), unchanged when the call made no task."""
        if self.life is None:
            return result
        return result.model_copy(update={"task": self.life.model_dump(mode="json")})


_watching: contextvars.ContextVar[TaskWatch | None] = contextvars.ContextVar("envace_task_watch", default=None)


@contextmanager
def watch() -> Iterator[TaskWatch]:
    """Collect the life of the task the calls inside create (the SDK resolves the task in the caller's
    own context, so a context variable reaches the claim without passing through the SDK)."""
    current = TaskWatch()
    token = _watching.set(current)
    try:
        yield current
    finally:
        _watching.reset(token)
