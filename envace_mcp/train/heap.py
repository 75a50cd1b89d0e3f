"""The process's heap during training (glibc only; no-ops elsewhere): how large blocks are served, and
handing freed memory back between passes. Packed passes of varying sizes leave freed blocks glibc
keeps for reuse, so the process grows past what is live; the fixes trade that memory for page faults."""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _glibc(function: str) -> Any:
    try:
        return getattr(ctypes.CDLL("libc.so.6"), function)
    except (OSError, AttributeError):  # not glibc
        return None


def release_freed_memory() -> None:
    """Hand memory freed by the last forward/backward back to the OS. glibc keeps freed heap blocks
    for reuse, and packed micro-batches of varying lengths leave them in sizes the next pass cannot
    use: RSS then grows well past what is live (a packed SFT batch: 6.4 GB RSS for 2.5 GB live).
    No-op off glibc."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)


def cap_heap_blocks(megabytes: float | None) -> bool:
    """Serve every allocation of `megabytes` or more with its own mmap, returned to the OS when freed
    (glibc's M_MMAP_THRESHOLD; process-wide from now on). glibc's default threshold rises to 32 MB as
    large blocks are freed, and after that activations come from the heap, whose freed blocks are kept:
    inside one packed pass RSS then grows far past what is live — a 3,152-token GRPO micro-batch of long
    bank runs: +2.84 GB after the forward with 0.32 GB saved for backward, +0.78 GB with a 1 MB
    threshold (`malloc_trim` after the pass cannot help the pass's own peak). The price is fresh pages
    for each large tensor (page faults): a packed SFT batch ran 89 s instead of 67 s. None: leave glibc's
    default. Returns whether it was set (False off glibc)."""
    mallopt = _glibc("mallopt") if megabytes is not None else None
    return mallopt is not None and bool(mallopt(-3, int(megabytes * 2**20)))  # M_MMAP_THRESHOLD


def after_backward(rows: int, share_prefix: bool) -> None:
    """Called after each training pass's backward: a pass that packed several rows into one sequence
    hands its freed heap back (`release_freed_memory`); one-row passes have steady sizes and skip it."""
    if share_prefix and rows > 1:
        release_freed_memory()
