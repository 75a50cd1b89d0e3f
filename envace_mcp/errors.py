"""One root error type for everything this package raises.

Tool failures, parse failures and rehearsal failures are *data* (results carrying an error kind),
never exceptions. Exceptions are kept for misuse of the library (`UserError`) and for bugs.
"""

from __future__ import annotations


class EnvaceError(Exception):
    """Root of every exception raised by envace-mcp."""


class UserError(EnvaceError, ValueError):
    """The library was used wrongly: bad configuration, bad call order, unknown names."""


class ConfigError(UserError):
    """A server configuration (the `mcpServers` JSON) is malformed."""


class BackendError(EnvaceError):
    """A generation backend failed: a model server unreachable, erroring, timing out, or answering
    without what training needs (token ids, logprobs). `status` is the HTTP status it answered, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
