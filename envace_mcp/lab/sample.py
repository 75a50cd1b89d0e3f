"""A seeded training mix: runs drawn from several trace folders into one (`envace lab sample`).

From each `DIR:N`, N runs drawn without replacement (`DIR`: every run); attached rewards travel with
their runs; the same folders and seed draw the same runs. Every source is drawn before anything is
written, so a bad one leaves no half mix."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace_mcp.errors import UserError
from envace_mcp.traces import TraceStore


@dataclass(frozen=True)
class Draw:
    """The runs drawn from one source folder, and how many it held."""

    folder: Path
    runs: list[Any]
    held: int


def parse_source(text: str) -> tuple[Path, int | None]:
    """`DIR` (every run) or `DIR:N` as (folder, N); the folder must exist."""
    folder, _, count = text.rpartition(":")
    if not (folder and count.isdigit()):
        folder, count = text, ""
    if count == "0":
        raise UserError(f"{text}: N must be at least 1")
    path = Path(folder)
    if not path.is_dir():
        raise UserError(f"trace folder {folder!r} does not exist")
    return path, int(count) if count else None


def refuse_filled(out: Path) -> None:
    """A sample goes into a new folder (or one without traces)."""
    if TraceStore(out).files():
        raise UserError(f"{out} already holds traces; a sample goes into a new folder")


def draw_sample(sources: list[str], seed: int = 0,
                on_problems: Callable[[TraceStore], None] | None = None) -> list[Draw]:
    """The runs each source gives, drawn with `seed`; `on_problems` sees each store once it was read
    (its unreadable lines, as warnings)."""
    picks = [parse_source(source) for source in sources]
    rng, drawn = random.Random(seed), []
    for path, count in picks:
        store = TraceStore(path)
        runs = list(store.read())
        if on_problems is not None:
            on_problems(store)
        if count is not None and count > len(runs):
            raise UserError(f"{path} holds {len(runs)} runs, fewer than the {count} asked for")
        drawn.append(Draw(path, runs if count is None else rng.sample(runs, count), len(runs)))
    return drawn


def write_sample(out: Path, drawn: list[Draw]) -> int:
    """Every drawn run appended to `out`, which must still hold no traces; returns the runs written."""
    refuse_filled(out)  # again: written meanwhile
    target = TraceStore(out)
    for draw in drawn:
        for trace in draw.runs:
            target.append(trace)
    return sum(len(draw.runs) for draw in drawn)
