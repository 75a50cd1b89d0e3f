"""Starting a suite's server in another process: the interpreter arguments, a free port, waiting for it."""

from __future__ import annotations

import socket
import subprocess
import time

from envace_mcp.errors import UserError


def module_args(module: str, *args: str) -> list[str]:
    """Interpreter arguments that run `module` from any working directory.

    `-P` (Python 3.11+) keeps `python -m` from putting the working directory first on `sys.path`: in the
    root of a source checkout the folder `envace_mcp/` (which has no `servers/`; setuptools installs
    `servers/` as `envace_mcp.servers`) would shadow the installed package and the server would not start.
    """
    return ["-P", "-m", module, *args]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise UserError(f"server exited with code {proc.returncode} before listening:\n{err}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise UserError(f"server did not listen on port {port} within {timeout:g} s")
