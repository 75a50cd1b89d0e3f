"""A hand-written MCP server (JSON-RPC over stdio, no SDK) that misbehaves on request, for hostile tests.

    python tests/raw_server.py '{"tools": [...], "hang": "tools/list", "stderr_mb": 20, ...}'

Behaviour (all optional): `tools` (listed as given, duplicates and odd schemas included); `hang` (an
MCP method never answered: "initialize", "tools/list"); `stderr_mb` (megabytes written to stderr at
start); `calls` maps a tool name to what its call does: "ok", "bad_byte" (one non-UTF-8 byte in the
reply line, then healthy replies), "deep:N" (a result nested N levels deep), "slow:S" (reply after S
seconds). Every call is also logged to stderr as `call NAME`.
"""

from __future__ import annotations

import json
import sys
import time


def reply(message_id, result) -> bytes:
    return (json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}) + "\n").encode()


def main() -> None:
    behaviour = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    out = sys.stdout.buffer
    if behaviour.get("stderr_mb"):
        chunk = "x" * 1023 + "\n"
        for _ in range(int(behaviour["stderr_mb"] * 1024)):
            sys.stderr.write(chunk)
        sys.stderr.write("END-OF-FLOOD\n")
        sys.stderr.flush()
    for raw in sys.stdin.buffer:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        method, message_id = message.get("method"), message.get("id")
        if message_id is None:
            continue  # a notification
        if method == behaviour.get("hang"):
            time.sleep(3600)
        if method == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "raw", "version": "0"}}
        elif method == "tools/list":
            result = {"tools": behaviour.get("tools", [{"name": "echo", "inputSchema": {"type": "object"}}])}
        elif method == "tools/call":
            name = message["params"]["name"]
            sys.stderr.write(f"call {name}\n")
            sys.stderr.flush()
            action = behaviour.get("calls", {}).get(name, "ok")
            if action == "bad_byte":
                behaviour["calls"][name] = "ok"  # once
                out.write(b'{"jsonrpc": "2.0", "id": ' + json.dumps(message_id).encode()
                          + b', "result": {"content": [{"type": "text", "text": "caf\xe9"}]}}\n')
                out.flush()
                continue
            if action.startswith("deep:"):
                depth = int(action.split(":")[1])
                value = "[" * depth + "]" * depth
                line = ('{"jsonrpc": "2.0", "id": ' + json.dumps(message_id) + ', "result": {"content": [], '
                        '"structuredContent": {"v": ' + value + "}}}\n")
                out.write(line.encode())
                out.flush()
                continue
            if action.startswith("slow:"):
                time.sleep(float(action.split(":")[1]))
            result = {"content": [{"type": "text", "text": f"ok {name}"}], "isError": False}
        elif method == "ping":
            result = {}
        else:
            out.write((json.dumps({"jsonrpc": "2.0", "id": message_id,
                                   "error": {"code": -32601, "message": f"no method {method}"}}) + "\n").encode())
            out.flush()
            continue
        out.write(reply(message_id, result))
        out.flush()


if __name__ == "__main__":
    main()
