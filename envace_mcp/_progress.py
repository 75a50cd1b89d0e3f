"""Progress for long work (eval, SFT, GRPO, reference traces, benchmarks), wherever the output goes.

On a terminal it is a live rich bar. Anywhere else (a log file, CI, `nohup`, a job scheduler) rich
draws nothing until the end, so a plain line is printed instead: when the work starts, then every
`interval` seconds whether or not an item finished (a heartbeat for slow items), and when it ends:

    [eval bank/test] 5/12 (42%)  passed 2/5  score 0.40  elapsed 3m12s  eta 4m29s

    with Progress("eval bank/test", total=12) as progress:
        progress.advance(passed="2/5", score=0.4)
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

DEFAULT_INTERVAL = 20.0
"""Seconds between plain lines: often enough to see a run is alive, rare enough for a readable log
(`ENVACE_PROGRESS_INTERVAL` overrides it)."""


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class Progress:
    """Items done of `total`, with named values shown beside them (a running mean, the last loss)."""

    def __init__(self, description: str, total: int, *, completed: int = 0, stream: TextIO | None = None,
                 console: Any = None, interval: float | None = None, live: bool | None = None) -> None:
        self.description = description
        self.total = total
        self.completed = completed
        self.values: dict[str, Any] = {}
        self.stream = stream or sys.stdout
        self.console = console
        self.interval = interval if interval is not None else float(os.environ.get("ENVACE_PROGRESS_INTERVAL",
                                                                                  DEFAULT_INTERVAL))
        self.live = live if live is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self._start = self._start_count = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        self._start, self._start_count = time.monotonic(), self.completed
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                     console=self.console or Console(file=self.stream))
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=self.total, completed=self.completed)
        else:
            self._print()
            self._thread = threading.Thread(target=self._heartbeat, name="envace-progress", daemon=True)
            self._thread.start()
        return self

    def advance(self, n: int = 1, **values: Any) -> None:
        self.update(completed=self.completed + n, **values)

    def update(self, *, completed: int | None = None, **values: Any) -> None:
        with self._lock:
            if completed is not None:
                self.completed = completed
            self.values.update(values)
        if self._bar is not None:
            shown = "  ".join(f"{k} {_value(v)}" for k, v in self.values.items())
            self._bar.update(self._task, completed=self.completed,
                             description=f"{self.description}  {shown}" if shown else self.description)

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._print(final=True)

    def line(self) -> str:
        """The plain progress line as it stands now."""
        with self._lock:
            done, values = self.completed, dict(self.values)
        elapsed = time.monotonic() - self._start
        parts = [f"[{self.description}] {done}/{self.total}" + (f" ({done / self.total:.0%})" if self.total else "")]
        parts += [f"{k} {_value(v)}" for k, v in values.items()]
        parts.append(f"elapsed {duration(elapsed)}")
        rate_done = done - self._start_count
        if 0 < rate_done and done < self.total:
            parts.append(f"eta {duration(elapsed / rate_done * (self.total - done))}")
        return "  ".join(parts)

    def _print(self, final: bool = False) -> None:
        self.stream.write(self.line() + ("  done" if final and self.completed >= self.total else "") + "\n")
        self.stream.flush()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.interval):
            self._print()
