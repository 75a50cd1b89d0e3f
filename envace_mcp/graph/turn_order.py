"""The calls of one AI turn that a tool node runs together, asking a person in the calls' order.

LangGraph's `ToolNode` runs a turn's calls side by side (a task each, or a thread each), and each call
is rehearsed and gated on its own: left alone, a call asks for approval as soon as its own rehearsal is
done, so the second call of a turn can be asked about first, and two requests can be open at once.
A `Turn` holds each call back until every call before it has passed its approval point (asked and
answered, or gated without a question), so the requests come one at a time, in the order the model
wrote the calls, each saying which call of how many it is.

    turn = Turn(["call_a", "call_b"])          # the ids of the calls the node runs, in order
    await turn.wait(1)                         # call_b waits until call_a has passed
    turn.passed(0)                             # call_a: asked and answered (or not asked)

A call that fails or is cancelled must still pass (`finally`), or the calls after it wait for it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class Turn:
    """The ids of the calls a tool node runs together, in the order the model wrote them."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = list(ids)
        self._lock = threading.Lock()  # a sync tool node runs each call in a thread of its own
        self._passed: set[int] = set()
        self._waiting: list[tuple[int, Callable[[], None]]] = []

    def position(self, call_id: str) -> tuple[int, int] | None:
        """(index, number of calls) of `call_id` in this turn; None when it is not one of them, or its id is
        not its own (a repeated id)."""
        if self.ids.count(call_id) != 1:
            return None
        return self.ids.index(call_id), len(self.ids)

    def _ready(self, index: int) -> bool:
        return all(i in self._passed for i in range(index))

    async def wait(self, index: int) -> None:
        """Until every call before call `index` has passed (from async code)."""
        loop, ready = asyncio.get_running_loop(), asyncio.Event()
        if self._enqueue(index, lambda: loop.call_soon_threadsafe(ready.set)):
            await ready.wait()

    def wait_sync(self, index: int) -> None:
        """Until every call before call `index` has passed (from a thread of its own)."""
        ready = threading.Event()
        if self._enqueue(index, ready.set):
            ready.wait()

    def _enqueue(self, index: int, wake: Callable[[], None]) -> bool:
        with self._lock:
            if self._ready(index):
                return False
            self._waiting.append((index, wake))
            return True

    def passed(self, index: int) -> None:
        """Call `index` has passed its approval point: the calls waiting only on it may ask. Idempotent."""
        with self._lock:
            self._passed.add(index)
            woken = [w for w in self._waiting if self._ready(w[0])]
            self._waiting = [w for w in self._waiting if w not in woken]
        for _, wake in woken:
            wake()


CURRENT: ContextVar[Turn | None] = ContextVar("envace_turn", default=None)
"""The turn the running tool node runs: set around the node's run, seen by each call's task or thread
(both copy the context they start in)."""


@contextmanager
def running(ids: list[str]) -> Iterator[Turn]:
    """Make `ids` the current turn while the node runs its calls."""
    turn = Turn(ids)
    token = CURRENT.set(turn)
    try:
        yield turn
    finally:
        CURRENT.reset(token)
