"""Progress for long work: plain lines with done/total, values, elapsed and ETA when the output is no
terminal; a heartbeat line even while no item finishes."""

import io
import time

from envace_mcp._progress import Progress, duration


def test_plain_lines_show_done_total_values_elapsed_and_eta():
    stream = io.StringIO()
    with Progress("eval bank/test", total=4, stream=stream, interval=3600) as progress:
        progress.advance(passed="1/1", score=1.0)
        progress.advance(passed="1/2", score=0.5)
        middle = progress.line()
        progress.advance(2, passed="3/4", score=0.75)
    first, last = stream.getvalue().splitlines()
    assert first.startswith("[eval bank/test] 0/4 (0%)") and "eta" not in first
    assert middle.startswith("[eval bank/test] 2/4 (50%)  passed 1/2  score 0.5  elapsed ") and " eta " in middle
    assert last.startswith("[eval bank/test] 4/4 (100%)  passed 3/4  score 0.75") and last.endswith("done")


def test_a_heartbeat_line_is_printed_while_an_item_is_still_running():
    stream = io.StringIO()
    with Progress("GRPO", total=2, stream=stream, interval=0.01):
        deadline = time.monotonic() + 10
        while stream.getvalue().count("\n") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 4 and all(line.startswith("[GRPO] 0/2") for line in lines)
    assert not lines[-1].endswith("done")  # stopped before the work was done


def test_a_live_bar_on_a_terminal_prints_no_plain_lines():
    stream = io.StringIO()
    with Progress("SFT", total=3, stream=stream, live=True) as progress:
        progress.advance(loss=0.5)
    assert "[SFT]" not in stream.getvalue()


def test_durations_read_like_a_clock():
    assert [duration(s) for s in (4.4, 75, 3725)] == ["4s", "1m15s", "1h02m"]
