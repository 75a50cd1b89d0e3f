"""A stdio server's stderr, kept as a bounded tail in memory (quoted in start-up and `server_died` errors)."""

from __future__ import annotations

import os
import select
import threading
import time
from typing import IO


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
