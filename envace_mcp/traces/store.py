"""Append-only JSONL trace files: crash-safe writes, streaming filtered reads.

One run per line (`{"kind": "trace", ...}`); rewards attached later are their own small lines
(`{"kind": "reward", "run_id": ..., "reward": {...}}`) merged in when reading. Each record is one
`write(2)` to a file opened `O_APPEND` under an exclusive `flock`, so concurrent writers — threads
or processes — never interleave, and a writer killed mid-record leaves every earlier record intact:
the torn tail is reported in `problems` and skipped, never fatal. With `compress=True` each record is
its own gzip member (a torn member is detected the same way).
"""

from __future__ import annotations

import fcntl
import gzip
import io
import json
import os
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envace_mcp.errors import UserError
from envace_mcp.traces.schema import Reward, Trace, read_trace

_REWARD_PREFIX = b'{"kind":"reward"'


class TraceStore:
    """A folder of trace files. Writes go to `traces.jsonl` (or `.jsonl.gz`); reads cover every file."""

    def __init__(self, directory: str | Path, *, compress: bool = False, fsync: bool = False) -> None:
        self.directory = Path(directory)
        self.path = self.directory / ("traces.jsonl.gz" if compress else "traces.jsonl")
        self.compress = compress
        self.fsync = fsync
        """Also `fsync` each record (survives power loss, not just a killed process); slower."""
        self.problems: list[str] = []
        """What the last read skipped: torn tails and corrupt lines, with file and line."""
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ writing

    def append(self, trace: Trace) -> None:
        self._write({"kind": "trace", **trace.model_dump(mode="json")})

    def attach_reward(self, run_id: str, reward: Reward) -> None:
        """Record a reward for a stored run (read back merged into the trace's `rewards`)."""
        self._write({"kind": "reward", "run_id": run_id, "reward": reward.model_dump(mode="json")})

    def _write(self, record: dict[str, Any]) -> None:
        # Lone surrogates (bytes a tool decoded with surrogateescape) cannot be UTF-8: written as JSON
        # \uXXXX escapes they read back as the same string.
        data = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace")
        if self.compress:
            data = gzip.compress(data)
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    # ------------------------------------------------------------------ reading

    def files(self) -> list[Path]:
        if not self.directory.exists():
            return []
        return sorted(p for p in self.directory.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz")))

    def _lines(self, path: Path, problems: list[str]) -> Iterator[tuple[int, bytes]]:
        if path.name.endswith(".gz"):
            yield from self._gzip_lines(path, problems)
            return
        with open(path, "rb") as fh:
            for number, line in enumerate(fh, 1):
                if not line.endswith(b"\n"):
                    problems.append(f"{path.name}:{number}: torn tail ({len(line)} bytes without a newline), skipped")
                    return
                yield number, line

    def _gzip_lines(self, path: Path, problems: list[str]) -> Iterator[tuple[int, bytes]]:
        raw = path.read_bytes()
        number, offset = 0, 0
        while offset < len(raw):
            decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                data = decompressor.decompress(raw[offset:])
            except zlib.error as exc:
                problems.append(f"{path.name}: corrupt gzip member at byte {offset} ({exc}), rest skipped")
                return
            if not decompressor.eof:
                problems.append(f"{path.name}: torn gzip member at byte {offset}, skipped")
                return
            offset = len(raw) - len(decompressor.unused_data)
            for line in io.BytesIO(data):
                number += 1
                yield number, line

    def _rewards(self) -> dict[str, list[Reward]]:
        rewards: dict[str, list[Reward]] = {}
        for path in self.files():
            for _, line in self._lines(path, []):  # the main pass reports problems
                if line.startswith(_REWARD_PREFIX):
                    try:
                        record = json.loads(line)
                        rewards.setdefault(record["run_id"], []).append(Reward.model_validate(record["reward"]))
                    except (ValueError, KeyError):
                        continue
        return rewards

    def read(
        self,
        *,
        suite: str | None = None,
        task: str | None = None,
        status: str | None = None,
        group: str | None = None,
        reward: tuple[str, float | None, float | None] | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> Iterator[Trace]:
        """Stream the stored traces that pass every given filter (never all in memory).

        `reward=("task", 0.5, None)` keeps runs whose latest `task` reward is ≥ 0.5.
        """
        self.problems = []
        attached = self._rewards()
        for path in self.files():
            for number, line in self._lines(path, self.problems):
                if line.startswith(_REWARD_PREFIX) or not line.strip():
                    continue
                try:
                    data = json.loads(line)
                    data.pop("kind", None)
                    trace = read_trace(data)
                except ValueError as exc:
                    self.problems.append(f"{path.name}:{number}: unreadable record ({str(exc)[:120]}), skipped")
                    continue
                if trace.run_id in attached:
                    trace.rewards.extend(attached[trace.run_id])
                if _keep(trace, suite, task, status, group, reward, since, until):
                    yield trace

    def get(self, run_id: str) -> Trace:
        for trace in self.read():
            if trace.run_id == run_id or trace.run_id.startswith(run_id):
                return trace
        raise UserError(f"no run {run_id!r} in {self.directory}")

    def __iter__(self) -> Iterator[Trace]:
        return self.read()


def _keep(trace: Trace, suite, task, status, group, reward, since, until) -> bool:  # noqa: ANN001
    if suite is not None and trace.suite != suite:
        return False
    if task is not None and trace.task_id != task:
        return False
    if status is not None and trace.status != status:
        return False
    if group is not None and trace.group_id != group:
        return False
    if since is not None and trace.started_at < since:
        return False
    if until is not None and trace.started_at > until:
        return False
    if reward is not None:
        name, low, high = reward
        found = trace.reward(name)
        if found is None or found.value is None:
            return False
        if (low is not None and found.value < low) or (high is not None and found.value > high):
            return False
    return True


def to_dataset(store: TraceStore, **filters: Any) -> Any:
    """The stored traces as a Hugging Face `datasets.Dataset` (extra `datasets`), one row per run;
    steps, rewards and settings are JSON strings so the schema stays flat and stable."""
    try:
        from datasets import Dataset
    except ImportError as exc:
        raise UserError("to_dataset needs the `datasets` package: pip install 'envace-mcp[datasets]'") from exc

    def rows() -> Iterator[dict[str, Any]]:
        for trace in store.read(**filters):
            data = trace.model_dump(mode="json")
            yield {key: (json.dumps(value) if isinstance(value, (dict, list)) else value) for key, value in data.items()}

    return Dataset.from_generator(rows)
