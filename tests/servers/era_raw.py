"""A hand-written stdio MCP server (JSON-RPC, no SDK) that lies about its protocol era.

    python tests/servers/era_raw.py liar|future|garbage

- `liar`: answers `server/discover` claiming 2026-07-28, then behaves as a 2025 server: every request
  before `initialize` is refused ("not initialized"); after the handshake it lists and calls.
- `future`: names a revision that does not exist (2099-01-01) in discover and in initialize.
- `garbage`: answers discover with a result that is no discover result; the handshake then works.
Every request's method is appended to `ERA_LOG` (one JSON line), when set.
"""

from __future__ import annotations

import json
import os
import sys

TOOLS = [{"name": "ping_raw", "description": "Answer pong.", "inputSchema": {"type": "object"}}]


def main() -> None:
    mode = sys.argv[1]
    log = os.environ.get("ERA_LOG")
    initialized = False
    for raw in sys.stdin.buffer:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        method, message_id = message.get("method"), message.get("id")
        if log:
            with open(log, "a") as fh:
                fh.write(json.dumps({"method": method}) + "\n")
        if message_id is None:
            continue
        result = error = None
        if method == "server/discover":
            if mode == "liar":
                result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "resultType": "complete"}
            elif mode == "future":
                result = {"supportedVersions": ["2099-01-01"], "capabilities": {"tools": {}}}
            else:
                result = "garbage \u202e\x1b[31m"
        elif method == "initialize":
            initialized = True
            version = "2099-01-01" if mode == "future" else "2025-06-18"
            result = {"protocolVersion": version, "capabilities": {"tools": {}},
                      "serverInfo": {"name": f"raw-{mode}", "version": "0"}}
        elif not initialized:
            error = {"code": -32600, "message": "Bad Request: server not initialized"}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "pong"}], "isError": False}
        else:
            error = {"code": -32601, "message": f"no method {method}"}
        reply = {"jsonrpc": "2.0", "id": message_id, **({"error": error} if error else {"result": result})}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
