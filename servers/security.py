"""Serving a bundled server over HTTP safely: loopback by default, DNS-rebinding protection always.

The bundled servers have no authentication, so binding off loopback takes an explicit flag, and a
request's Host and Origin headers must name the address they were meant for.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
"""Binds that listen on every address: no one name says which Host header clients will send."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def remote_refusal(host: str, allow_remote: bool, allowed_hosts: Sequence[str] = ()) -> str | None:
    """Why serving over HTTP on `host` is refused, or None. The bundled servers have no authentication:
    off loopback, anyone who can reach the port can call every tool, so that takes an explicit flag."""
    if is_loopback(host):
        return None
    if not allow_remote:
        return (f"--host {host!r} is not a loopback address and the server has no authentication: anyone who can "
                "reach it could call every tool; pass --allow-remote to serve it there anyway")
    if host in WILDCARD_HOSTS and not allowed_hosts:
        return (f"--host {host!r} listens on every address: name the host names or addresses clients will use with "
                "--allowed-host (requests naming any other host are refused, against DNS rebinding)")
    return None


def http_security(host: str, allowed_hosts: Sequence[str] = ()) -> Any:
    """DNS-rebinding protection for a streamable HTTP server bound to `host`: a request's Host header must
    name `host`, loopback (when `host` is loopback) or one of `allowed_hosts`, and a browser's Origin one
    of those too. The SDK turns it on by itself only for exactly 127.0.0.1, localhost and ::1, and leaves
    it off for any other bind."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = [*allowed_hosts, *([] if host in WILDCARD_HOSTS else [host]), *(LOOPBACK_HOSTS if is_loopback(host) else ())]
    hosts = [_host_form(name) for name in dict.fromkeys(names)]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[form for h in hosts for form in (h, f"{h}:*")],
        allowed_origins=[f"{scheme}://{form}" for h in hosts for scheme in ("http", "https") for form in (h, f"{h}:*")],
    )


def _host_form(name: str) -> str:
    """An address as a Host header writes it (IPv6 in brackets)."""
    try:
        return f"[{name}]" if ipaddress.ip_address(name).version == 6 else name
    except ValueError:
        return name
