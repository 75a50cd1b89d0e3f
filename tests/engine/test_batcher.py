"""The batcher's continuous mode, with a stand-in stream (no model): requests that arrive while a
stream runs join it, results reach callers as soon as their row is done, failures stay local."""

import time

import anyio
import pytest

from envace_mcp.engine.batcher import Batcher

pytestmark = pytest.mark.anyio


def counting_stream(feed, max_rows):
    """Each job is a number of steps; one step per 5 ms for every live row; a negative job fails; a row
    whose caller gave up is dropped. Steps run are counted in `counting_stream.steps`."""
    live = []
    while True:
        for steps, ticket in feed.take(max_rows - len(live)):
            if steps < 0:
                feed.fail(ticket, ValueError(f"bad job {steps}"))
            else:
                live.append([steps, ticket, 0])
        if not live:
            return
        feed.rows(len(live))
        time.sleep(0.005)
        live = [row for row in live if feed.wanted(row[1])]
        for row in list(live):
            row[2] += 1
            counting_stream.steps += 1
            if row[2] >= row[0]:
                feed.deliver(row[1], f"done after {row[2]} steps")
                live.remove(row)


counting_stream.steps = 0


async def test_a_request_arriving_mid_stream_joins_it_and_returns_before_the_long_one():
    batcher = Batcher(counting_stream, max_batch=4, window_s=0.0)
    finished: list[str] = []

    async def one(name, steps, delay):
        await anyio.sleep(delay)
        result = await batcher.submit(steps)
        finished.append(name)
        return result

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "long", 60, 0)
        tg.start_soon(one, "short", 2, 0.05)  # the long one is ~10 steps in
    assert finished == ["short", "long"]
    assert batcher.batch_sizes == [2]  # one stream, both rows in it at once


async def test_a_full_stream_leaves_later_requests_for_the_next_and_failures_stay_local():
    batcher = Batcher(counting_stream, max_batch=2, window_s=0.01)
    results = {}

    async def one(i, steps):
        try:
            results[i] = await batcher.submit(steps)
        except ValueError as exc:
            results[i] = exc

    async with anyio.create_task_group() as tg:
        for i, steps in enumerate([3, -1, 5, 4, 2]):
            tg.start_soon(one, i, steps)
    assert isinstance(results[1], ValueError)
    assert results[0] == "done after 3 steps" and results[4] == "done after 2 steps"
    assert max(batcher.batch_sizes) == 2


async def test_a_stream_that_crashes_fails_its_callers_and_the_queue_goes_on():
    calls = []

    def flaky(feed, max_rows):
        calls.append(1)
        taken = feed.take(max_rows)
        if len(calls) == 1:
            raise RuntimeError("device lost")
        for steps, ticket in taken:
            feed.deliver(ticket, steps * 2)

    batcher = Batcher(flaky, max_batch=4, window_s=0.0)
    with pytest.raises(RuntimeError, match="device lost"):
        await batcher.submit(1)
    assert await batcher.submit(21) == 42


async def test_a_caller_that_gives_up_stops_its_row_so_a_stop_does_not_wait_for_the_worker_thread():
    batcher = Batcher(counting_stream, max_batch=4, window_s=0.0)
    counting_stream.steps = 0
    with anyio.move_on_after(0.1):
        await batcher.submit(2000)  # 10 s of steps
    queue = next(iter(batcher._queues.values()))
    await queue.worker  # the stream's thread: it returns once it sees the caller gone
    assert counting_stream.steps < 200
    assert await batcher.submit(3) == "done after 3 steps"  # the queue goes on
