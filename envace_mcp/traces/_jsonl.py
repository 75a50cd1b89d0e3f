"""JSONL files of runs for other tools (LangSmith examples, ATIF trajectories): written whole or not at
all, read line by line with every bad line skipped and said why."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from envace_mcp.errors import UserError
from envace_mcp.traces.schema import Trace

T = TypeVar("T")


def write_runs(traces: Iterable[Trace], path: str | Path, record: Callable[[Trace], dict[str, Any]], *,
               skipped: list[str] | None = None) -> int:
    """Write `record(trace)` per run, one JSON object a line; returns how many. The file appears whole or
    not at all (written beside it, then renamed over it). A run `record` refuses (`ValueError`) or that
    cannot be written as JSON (a tool's reply nested deeper than serialisation allows) is left out, and why
    is appended to `skipped`."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{str(path)!r} is a folder; give the file to write (e.g. runs.jsonl)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
            for trace in traces:
                try:
                    line = json.dumps(record(trace), ensure_ascii=False)
                except (ValueError, RecursionError) as exc:
                    if skipped is not None:
                        skipped.append(f"run {trace.run_id[:200]!r} left out: {str(exc)[:200]}")
                    continue
                fh.write(line + "\n")
                count += 1
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return count


def read_runs(path: Path, parse: Callable[[bytes, int], T], *, what: str,
              limit: int | None = None) -> tuple[list[T], list[tuple[int, str]]]:
    """`parse(line, number)` of each non-blank line of a JSONL file, and the lines skipped, `(number, why)`:
    those `parse` refuses (`ValueError`; a torn last line says so) and, with `limit`, those longer than
    `limit` bytes (passed over unread). A file that cannot be opened is a `UserError` naming it as `what`."""
    found: list[T] = []
    skipped: list[tuple[int, str]] = []
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; opening is what may fail
    except OSError as exc:
        raise UserError(f"{what} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    with fh:
        number = 0
        while line := fh.readline(-1 if limit is None else limit + 1):
            number += 1
            if limit is not None and len(line) > limit and not line.endswith(b"\n"):
                while (rest := fh.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass
                skipped.append((number, f"longer than {limit:,} bytes"))
                continue
            if not line.strip():
                continue
            try:
                found.append(parse(line, number))
            except ValueError as exc:
                torn = " (the file's last line, cut short)" if not line.endswith(b"\n") else ""
                skipped.append((number, f"{str(exc)[:200]}{torn}"))
    return found, skipped


def why_invalid(exc: Exception) -> str:
    """Why a record was refused, in a line: pydantic's first error names the field (`steps.0.role: ...`)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where}: {first.get('msg')}"
    return f"{type(exc).__name__}: {exc}"
