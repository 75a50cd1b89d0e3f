"""Coalescing concurrent generation requests into padded batches.

Many graph runs ask the policy for a turn at nearly the same time (GRPO groups, test-time
rehearsal). Each request waits a short window for company, then the whole batch is generated in one
padded forward pass per token, in a worker thread so the event loop keeps running the graphs.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import anyio.to_thread

J = TypeVar("J")
R = TypeVar("R")


class Batcher(Generic[J, R]):
    """Collects jobs per event loop and runs them `max_batch` at a time through `run`."""

    def __init__(self, run: Callable[[list[J]], list[R]], *, max_batch: int = 16, window_s: float = 0.01,
                 max_wait_s: float = 0.25) -> None:
        self.run = run
        self.max_batch = max(1, max_batch)
        self.window_s = window_s
        """How long the batch stays open after the last request arrived."""
        self.max_wait_s = max_wait_s
        """The longest the first request of a batch waits for company."""
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue[J, R]] = weakref.WeakKeyDictionary()
        self.batch_sizes: list[int] = []
        """Sizes of the batches run so far (for benchmarks and tests)."""

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
        self.worker: asyncio.Task[None] | None = None

    async def submit(self, job: J) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
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
            batch = [(j, f) for j, f in self.pending[: owner.max_batch] if not f.done()]
            del self.pending[: owner.max_batch]
            if not batch:
                continue
            owner.batch_sizes.append(len(batch))
            try:
                results = await anyio.to_thread.run_sync(owner.run, [j for j, _ in batch])
            except Exception as exc:  # a failed batch fails its callers, not the queue
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)
