"""Credentials out of what is written down: `http://user:pass@host` and `?api_key=...` in an address
become `http://***@host` and `?api_key=***` before they reach a trace, a result file or a message."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@?#]+@")
_SECRET_PARAM = re.compile(
    r"([?&;][^=&;\s#]*(?:key|token|secret|password|passwd|pwd|auth|signature|sig|credential|credentials)=)[^&;\s#]*",
    re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the user info of every URL in it, and query values whose name looks like a key or a
    token (`api_key`, `access_token`, `X-Amz-Signature`, ...), replaced by `***`."""
    return _SECRET_PARAM.sub(r"\1***", _USERINFO.sub(r"\1***@", text))
