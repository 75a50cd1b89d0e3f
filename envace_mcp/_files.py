"""Writing into output folders without following links, and one process per folder.

A link planted in an output folder (`results.md -> ~/.bashrc`) must not redirect a write: whole files
go to a temporary file created exclusively beside the destination and are renamed over it (a rename
replaces the link itself, never its target); journals are appended through `O_NOFOLLOW`. A folder in
use by one `envace` process is refused to a second (`hold_folder`): two writers tear its journal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from envace_mcp.errors import UserError

LOCK = ".lock"
"""The file `hold_folder` locks (it holds the holder's pid)."""


def read_bounded(path: str | Path, max_bytes: int) -> str | None:
    """A text file's contents (undecodable bytes replaced), or None where it is missing, unreadable or
    larger than `max_bytes`: for files an adapter folder brings, read as untrusted input."""
    path = Path(path)
    try:
        if not path.is_file() or path.stat().st_size > max_bytes:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def write_atomic(path: str | Path, data: str | bytes, *, mode: int = 0o644) -> None:
    """`data` as the whole of `path`: never torn, never through a link at `path` (a link there is replaced,
    its target left alone). `mode` applies to a new file (under the umask)."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")  # random: a planted name cannot be guessed
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_append(path: str | Path, *, truncate: bool = False, mode: int = 0o644) -> TextIO:
    """`path` opened to append text lines (or emptied first, with `truncate`), refusing a link there
    (`OSError` ELOOP) where `open(path, "a")` would write to the link's target."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if truncate else os.O_APPEND)
    return os.fdopen(os.open(path, flags, mode), "a", encoding="utf-8")


def savefig_atomic(fig: Any, path: str | Path, **kwargs: Any) -> None:
    """A matplotlib figure saved as `write_atomic` writes (a PNG; matplotlib itself would follow a link)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **kwargs)
    write_atomic(path, buffer.getvalue())


@contextlib.contextmanager
def hold_folder(folder: str | Path) -> Iterator[Path]:
    """Create `folder` and hold it for this process until the block ends (`flock` on `folder/.lock`,
    released by the kernel however the process ends). Another process holding it: a `UserError` naming
    its pid. Unwritable: a `UserError` saying where and why. A folder this created and left empty is
    removed again (a refused command writes nothing)."""
    folder = Path(folder)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _lock(folder / LOCK)
    except OSError as exc:
        raise UserError(f"cannot write to {folder}: {exc.strerror or exc}") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield folder
    finally:
        with contextlib.suppress(OSError):
            os.unlink(folder / LOCK)  # still held: a process that opened it now finds it gone and retries
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty


def _lock(path: Path) -> int:
    """An fd of `path` under an exclusive `flock` (the file at `path` now, not one unlinked meanwhile)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = "".join(c for c in os.pread(fd, 32, 0).decode("ascii", "replace") if c.isdigit()) or "unknown"
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise UserError(f"{path.parent} is in use by another envace process (pid {holder}); wait for it "
                            "to finish, or use another folder") from None
        try:
            if os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # its holder unlinked it as we opened it: lock the new one


def unwritable(exc: OSError, what: str | Path) -> UserError:
    """An `OSError` of writing `what` as one line for the user."""
    where = exc.filename or what
    if exc.errno == errno.ELOOP:
        return UserError(f"cannot write {where}: it is a link, and envace does not write through links in its "
                         "output folders; remove it")
    return UserError(f"cannot write {where}: {exc.strerror or exc}")
