"""Append-only JSONL trace files: crash-safe writes, streaming filtered reads.

One run per line (`{"kind": "trace", ...}`); rewards attached later are their own small lines
(`{"kind": "reward", "run_id": ..., "reward": {...}}`) merged in when reading. Each record is one
`write(2)` to a file opened `O_APPEND` under an exclusive `flock`, so concurrent writers — threads
or processes — never interleave, and a writer killed mid-record leaves every earlier record intact:
the torn tail is reported in `problems` and skipped, never fatal. A torn tail never swallows what
comes after it: the next append starts on a fresh line, and a reader resyncs at the next record
inside a damaged line. With `compress=True` each record is its own gzip member; files are streamed
member by member (memory and time linear in the file), and after a torn or corrupt member reading
resumes at the next gzip header. A line that is JSON of the wrong shape is a reported problem too.
"""

from __future__ import annotations

import contextlib
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

from envace_mcp._redact import redact
from envace_mcp.errors import UserError
from envace_mcp.traces.schema import Reward, Trace, read_trace

_REWARD_PREFIX = b'{"kind":"reward"'


def _searchable(mode: int) -> int:
    """A folder's mode for files of `mode`: whoever may read them may also enter it."""
    return mode | ((mode & 0o444) >> 2)


class TraceStore:
    """A folder of trace files. Writes go to `traces.jsonl` (or `.jsonl.gz`); reads cover every file."""

    def __init__(self, directory: str | Path, *, compress: bool = False, fsync: bool = False,
                 mode: int = 0o600) -> None:
        self.directory = Path(directory)
        self.path = self.directory / ("traces.jsonl.gz" if compress else "traces.jsonl")
        self.compress = compress
        self.fsync = fsync
        """Also `fsync` each record (survives power loss, not just a killed process); slower."""
        self.mode = mode
        """Permissions of a trace file this store creates (traces hold prompts, tool results, model
        addresses: owner-only by default); its folder, when created here, gets them plus search
        (`0o600` -> `0o700`, `0o644` -> `0o755`). Existing files and folders keep theirs."""
        self.problems: list[str] = []
        """What the last read skipped: torn tails and corrupt lines, with file and line."""
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ writing

    def append(self, trace: Trace) -> None:
        record = trace.model_dump(mode="json")
        for key in ("model", "error"):  # set after validation (`trace.error = ...`): redacted here too
            if isinstance(record.get(key), str):
                record[key] = redact(record[key])
        self._write({"kind": "trace", **record})

    def attach_reward(self, run_id: str, reward: Reward) -> None:
        """Record a reward for a stored run (read back merged into the trace's `rewards`)."""
        self._write({"kind": "reward", "run_id": run_id, "reward": reward.model_dump(mode="json")})

    def _write(self, record: dict[str, Any]) -> None:
        # Lone surrogates (bytes a tool decoded with surrogateescape) cannot be UTF-8: written as JSON
        # \uXXXX escapes they read back as the same string.
        data = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace")
        if self.compress:
            data = gzip.compress(data)
        if not self.directory.is_dir():
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # another writer made it first
                self.directory.mkdir(mode=_searchable(self.mode))
        with self._lock:
            # O_NOFOLLOW: a link planted as the trace file is refused, its target never written
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, self.mode)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                size = os.fstat(fd).st_size
                if not self.compress and size and os.pread(fd, 1, size - 1) != b"\n":
                    data = b"\n" + data  # a torn tail (a killed writer, NUL blocks) stays its own line
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
        number = 0
        for offset, data in _gzip_members(path):
            if isinstance(data, str):
                problems.append(f"{path.name}: {data} at byte {offset}, skipped")
                continue
            for line in io.BytesIO(data):
                number += 1
                yield number, line

    def _rewards(self) -> dict[str, list[Reward]]:
        rewards: dict[str, list[Reward]] = {}
        for path in self.files():
            for _, line in self._lines(path, []):  # the main pass reports problems
                if _REWARD_PREFIX not in line:  # cheap: only reward lines (or damaged ones holding one) are parsed
                    continue
                for record in _records(line)[1]:
                    if record.get("kind") != "reward":
                        continue
                    try:
                        run_id = record["run_id"]
                        if isinstance(run_id, str):
                            rewards.setdefault(run_id, []).append(Reward.model_validate(record["reward"]))
                    except (ValueError, KeyError, TypeError):
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
                whole, records = _records(line)
                if not records:
                    self.problems.append(f"{path.name}:{number}: unreadable line ({_why(line)}), skipped")
                elif not whole:
                    self.problems.append(f"{path.name}:{number}: damaged line, the record after the damage recovered")
                for data in records:
                    if data.get("kind") == "reward":
                        continue
                    try:
                        data = {k: v for k, v in data.items() if k != "kind"}
                        trace = read_trace(data)
                    except Exception as exc:  # noqa: BLE001 - any shape of bad record is a problem, never a crash
                        self.problems.append(f"{path.name}:{number}: not a trace ({type(exc).__name__}: "
                                             f"{str(exc)[:120]}), skipped")
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


_RECORD_START = b'{"kind":"'


def _records(line: bytes) -> tuple[bool, list[dict[str, Any]]]:
    """`(True, [record])` when the line parses whole; otherwise `(False, [record])` for a record that
    starts later in it and runs to its end (a torn record that a later append was written after, by a
    writer from before fresh-line appends), or `(False, [])`."""
    parsed = _object(line)
    if parsed is not None:
        return True, [parsed]
    start = line.find(_RECORD_START, 1)
    while start != -1:
        parsed = _object(line[start:])
        if parsed is not None:
            return False, [parsed]
        start = line.find(_RECORD_START, start + 1)
    return False, []


def _object(text: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _why(line: bytes) -> str:
    try:
        value = json.loads(line)
    except RecursionError:
        return "nested too deep"
    except ValueError as exc:
        return f"not JSON: {str(exc)[:80]}"
    return f"a JSON {type(value).__name__}, not a record"


_GZIP_MAGIC = b"\x1f\x8b\x08"
_CHUNK = 1 << 16


def _gzip_members(path: Path) -> Iterator[tuple[int, bytes | str]]:
    """Each gzip member of a file as `(offset, data)`, or `(offset, why)` for a damaged one, after which
    reading resumes at the next gzip header. The file is mapped, not read, and fed to the decompressor
    in bounded chunks: time and memory stay linear in its size."""
    import mmap

    if path.stat().st_size == 0:
        return
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        size, position = len(mapped), 0
        while position < size:
            start = position
            decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out: list[bytes] = []
            why = None
            try:
                while position < size and not decompressor.eof:
                    chunk = mapped[position: position + _CHUNK]
                    out.append(decompressor.decompress(chunk))
                    position += len(chunk) - len(decompressor.unused_data)
            except zlib.error as exc:
                why = f"corrupt gzip member ({exc})"
            if why is None and not decompressor.eof:
                why = "torn gzip member"
            if why is None:
                yield start, b"".join(out)
                continue
            yield start, why
            following = mapped.find(_GZIP_MAGIC, start + 1)
            if following == -1:
                return
            position = following


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
