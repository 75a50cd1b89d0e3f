"""From concurrent async requests to one decode stream in a worker thread (continuous batching).

Many graph runs ask the policy for a turn at nearly the same time (GRPO groups, test-time
rehearsal). The first request waits a short window for company, then a `stream` function runs in a
worker thread, so the event loop keeps running the graphs. The stream stays open while it runs:
requests that arrive meanwhile join it at the next token step, and each result is delivered as soon
as its row finishes, so a run whose turn is done goes on to its next request instead of waiting for
the batch's longest row.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio.to_thread

J = TypeVar("J")
R = TypeVar("R")


class Batcher(Generic[J, R]):
    """Collects jobs per event loop and streams them, up to `max_batch` rows at a time, through `stream`."""

    def __init__(self, stream: Callable[[Feed[J, R], int], int], *, max_batch: int = 16, window_s: float = 0.01,
                 max_wait_s: float = 0.25) -> None:
        self.stream = stream
        """`stream(feed, max_rows)` takes jobs from `feed` while it runs, delivers each result through it,
        drops the rows whose caller gave up (`feed.wanted`) and reports how many rows it decodes together
        (`feed.rows`)."""
        self.max_batch = max(1, max_batch)
        self.window_s = window_s
        """How long the batch stays open after the last request arrived."""
        self.max_wait_s = max_wait_s
        """The longest the first request of a batch waits for company."""
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue[J, R]] = weakref.WeakKeyDictionary()
        self.batch_sizes: list[int] = []
        """The most rows decoded together in each stream so far (for benchmarks and tests)."""

    async def submit(self, job: J) -> R:
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = _Queue(self)
        return await queue.submit(job)


class _Queue(Generic[J, R]):
    def __init__(self, owner: Batcher[J, R]) -> None:
        self.owner = owner
        self.pending: list[tuple[J, asyncio.Future[R]]] = []
        self.lock = threading.Lock()  # a streaming worker thread takes from `pending` too
        self.worker: asyncio.Task[None] | None = None

    async def submit(self, job: J) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        with self.lock:
            self.pending.append((job, future))
        if self.worker is None or self.worker.done():
            self.worker = asyncio.get_running_loop().create_task(self.work())
        return await future

    async def work(self) -> None:
        owner = self.owner
        while self.pending:
            # Requests of concurrent runs trickle in (each renders and tokenises a long prompt first):
            # keep the batch open while they keep arriving, up to max_wait_s.
            opened = time.monotonic()
            deadline, seen = opened + owner.window_s, len(self.pending)
            while len(self.pending) < owner.max_batch and time.monotonic() < deadline:
                await asyncio.sleep(owner.window_s / 5)
                if len(self.pending) > seen:
                    seen = len(self.pending)
                    deadline = min(time.monotonic() + owner.window_s, opened + owner.max_wait_s)
            feed = Feed(self, asyncio.get_running_loop())
            try:
                await anyio.to_thread.run_sync(owner.stream, feed, owner.max_batch)
            except Exception as exc:  # a failed stream fails the jobs it had taken, not the queue
                feed.fail_outstanding(exc)


class Feed(Generic[J, R]):
    """A running stream's side of the queue; `take`, `wanted` and `deliver` are called from the worker thread."""

    def __init__(self, queue: _Queue[J, R], loop: asyncio.AbstractEventLoop) -> None:
        self.queue, self.loop = queue, loop
        self.outstanding: dict[int, asyncio.Future[R]] = {}
        self.peak = 0

    def rows(self, n: int) -> None:
        """The stream decodes `n` rows together now (recorded in the batcher's `batch_sizes`, live:
        results can reach their callers before the stream returns)."""
        sizes = self.queue.owner.batch_sizes
        if n > self.peak:
            if self.peak == 0:
                sizes.append(n)
            else:
                sizes[-1] = n
            self.peak = n

    def take(self, n: int) -> list[tuple[J, int]]:
        """Up to `n` waiting jobs (callers that gave up are skipped), each with a ticket for `deliver`."""
        taken: list[tuple[J, int]] = []
        with self.queue.lock:
            while self.queue.pending and len(taken) < n:
                job, future = self.queue.pending.pop(0)
                if future.done():
                    continue
                self.outstanding[id(future)] = future
                taken.append((job, id(future)))
        return taken

    def wanted(self, ticket: int) -> bool:
        """Whether the job's caller still waits for it: one that gave up (cancelled, timed out, its run
        stopped) is not decoded further. Without this, a stop (SIGTERM) waited for every row the worker
        thread held to finish, since a thread cannot be cancelled."""
        future = self.outstanding.get(ticket)
        return future is not None and not future.done()

    def deliver(self, ticket: int, result: R) -> None:
        self._settle(ticket, lambda f: f.set_result(result))

    def fail(self, ticket: int, exc: BaseException) -> None:
        self._settle(ticket, lambda f: f.set_exception(exc))

    def fail_outstanding(self, exc: BaseException) -> None:
        for ticket in list(self.outstanding):
            self.fail(ticket, exc)

    def _settle(self, ticket: int, how: Callable[[asyncio.Future[R]], Any]) -> None:
        future = self.outstanding.pop(ticket, None)
        if future is None:
            return

        def settle() -> None:
            if not future.done():
                how(future)

        if _in_loop_thread(self.loop):
            settle()
        else:
            self.loop.call_soon_threadsafe(settle)


class ListFeed(Generic[J, R]):
    """A fixed list of jobs as a feed (synchronous callers); `results()` in the jobs' order."""

    def __init__(self, jobs: list[J]) -> None:
        self.jobs = list(jobs)
        self.next = 0
        self.out: dict[int, tuple[bool, Any]] = {}

    def rows(self, n: int) -> None:
        pass

    def take(self, n: int) -> list[tuple[J, int]]:
        taken = [(self.jobs[i], i) for i in range(self.next, min(len(self.jobs), self.next + n))]
        self.next += len(taken)
        return taken

    def wanted(self, ticket: int) -> bool:
        return True

    def deliver(self, ticket: int, result: R) -> None:
        self.out[ticket] = (True, result)

    def fail(self, ticket: int, exc: BaseException) -> None:
        self.out[ticket] = (False, exc)

    def results(self) -> list[R]:
        for ok, value in (self.out[i] for i in range(len(self.jobs))):
            if not ok:
                raise value
        return [self.out[i][1] for i in range(len(self.jobs))]


def _in_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
