"""`envace servers serve --transport http`: the bundled servers have no authentication, so serving off
loopback takes an explicit `--allow-remote` (and says so on stderr), and every HTTP bind keeps the SDK's
DNS-rebinding protection on (the SDK turns it on only for exactly 127.0.0.1, localhost and ::1)."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

CLI = [sys.executable, "-m", "envace_mcp.cli", "servers", "serve", "bank", "--transport", "http"]
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}


def envace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, "COLUMNS": "100"})


@pytest.mark.parametrize(("args", "fragment"), [
    (["--host", "0.0.0.0"], "'0.0.0.0' is not a loopback address"),
    (["--host", "192.0.2.7"], "pass --allow-remote"),
    (["--host", "example.com"], "pass --allow-remote"),
    (["--host", "0.0.0.0", "--allow-remote"], "name the host names or addresses clients will use with --allowed-host"),
])
def test_a_host_off_loopback_is_refused_in_one_line_unless_allowed(args, fragment):
    out = envace(*args)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and out.stdout == "" and len(lines) == 1
    assert lines[0].startswith("error: ") and fragment in lines[0]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _serve(host: str, *args: str) -> tuple[subprocess.Popen, str, int]:
    port = _free_port(socket.gethostbyname(host))
    process = subprocess.Popen([*CLI, "--host", host, "--port", str(port), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    address = socket.gethostbyname(host)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection((address, port), timeout=1):
                return process, address, port
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"server did not start: {process.communicate()[1][-2000:]}")
            time.sleep(0.1)


def _post(address: str, port: int, host_header: str, origin: str | None = None) -> int:
    headers = {"host": host_header, "accept": "application/json, text/event-stream", "content-type": "application/json"}
    if origin:
        headers["origin"] = origin
    return httpx.post(f"http://{address}:{port}/mcp", json=INIT, headers=headers, timeout=10).status_code


def _stop(process: subprocess.Popen) -> str:
    process.terminate()
    try:
        return process.communicate(timeout=15)[1]
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()[1]


def test_a_loopback_bind_the_sdk_does_not_know_still_refuses_a_rebound_host_header():
    process, address, port = _serve("127.0.0.2")
    try:
        assert _post(address, port, f"evil.example:{port}") == 421
        assert _post(address, port, f"127.0.0.2:{port}", origin="http://evil.example") == 403
        assert _post(address, port, f"127.0.0.2:{port}") == 200
    finally:
        _stop(process)


def test_serving_off_loopback_with_the_flag_warns_on_stderr_and_checks_hosts():
    name = socket.gethostname()
    try:
        if not ipaddress.ip_address(socket.gethostbyname(name)).is_loopback:
            pytest.skip(f"this machine's name {name!r} is not a loopback address: not bound in a test")
    except OSError:
        pytest.skip("this machine's name does not resolve")
    process, address, port = _serve(name, "--allow-remote")
    try:
        assert _post(address, port, f"evil.example:{port}") == 421
        assert _post(address, port, f"{name}:{port}") == 200
    finally:
        stderr = _stop(process)
    assert f"warning: serving bank over HTTP on {name}:{port} with no authentication" in stderr
