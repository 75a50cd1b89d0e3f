"""A hand-written MCP server (JSON-RPC over stdio, no SDK) that misbehaves on request, for hostile tests.

    python tests/raw_server.py '{"tools": [...], "hang": "tools/list", "stderr_mb": 20, ...}'

Behaviour (all optional): `tools` (listed as given, duplicates and odd schemas included); `hang` (an
MCP method never answered: "initialize", "tools/list"), `hang_if_exists` (a file: hang in
`initialize` only when it exists, which a call "exit" creates before the server exits: a server that
starts once and hangs on its restart), `relist_if_exists` ({"file": F, "tools": [...]}: list these
tools instead once F exists, which a call "exit" creates: a server that restarts with another
listing); `stderr_mb` (megabytes written to stderr at
start); `calls` maps a tool name to what its call does: "ok", "bad_byte" (one non-UTF-8 byte in the
reply line, then healthy replies), "deep:N" (a result nested N levels deep), "slow:S" (reply after S
seconds). Every call is also logged to stderr as `call NAME`. `fuzz_seed` + `fuzz_tools`: list that
many tools with random hostile input schemas and answer every call with a random hostile reply
(`fuzz_schema`, `fuzz_reply`).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

REMOTE = ["http://127.0.0.1:9/s.json", "file:///etc/passwd", "other.json#/x", "#/$defs/missing", "#", "#/properties",
          "#/$defs/a", "urn:x", "", "#nope"]
PATTERNS = ["^(a|a)*$", "^(a+)+$", "[", "(?P<x>a)(?P=x)", "^\\d{3}$", "(.*){30}", "\\p{L}+", "a{99999}"]


def fuzz_value(rng: random.Random, depth: int = 0, surrogates: bool = True):
    """Odd JSON values; `surrogates`: lone UTF-16 surrogates too (a listing holding one is unreadable as
    a whole, so the server would not start: tested apart)."""
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        odd = "\ud800" if surrogates else "\u00ff"
        return rng.choice([None, True, -1, 1e308, float("nan") if rng.random() < 0.1 else 0, "", "x" * rng.randrange(50),
                           odd, "caf\u00e9"])
    if roll < 0.7:
        return [fuzz_value(rng, depth + 1, surrogates) for _ in range(rng.randrange(4))]
    return {rng.choice(["type", "a", "", "$ref", "properties"]): fuzz_value(rng, depth + 1, surrogates)
            for _ in range(rng.randrange(4))}


def fuzz_schema(rng: random.Random, depth: int = 0) -> dict:
    """A subschema mixing what validators trip on: outside or looping refs, slow or broken patterns,
    wrong keyword types, deep nesting, odd formats."""
    kind = rng.randrange(12)
    if depth > 4 or kind == 0:
        return {"type": rng.choice(["string", "integer", "number", "boolean", "null", "array", "object", "nonsense"])}
    if kind == 1:
        return {"$ref": rng.choice(REMOTE)}
    if kind == 2:
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind == 3:
        return {"type": "object", "patternProperties": {rng.choice(PATTERNS): fuzz_schema(rng, depth + 1)},
                "additionalProperties": rng.choice([False, True, {"type": "integer"}])}
    if kind == 4:
        return {rng.choice(["allOf", "anyOf", "oneOf"]): [fuzz_schema(rng, depth + 1) for _ in range(rng.randrange(3))]}
    if kind == 5:
        return {"not": fuzz_schema(rng, depth + 1)}
    if kind == 6:
        return {"type": "array", "items": fuzz_schema(rng, depth + 1), "minItems": rng.choice([0, 1, -1, "2"])}
    if kind == 7:
        return {"enum": [fuzz_value(rng, surrogates=False) for _ in range(rng.randrange(4))]}
    if kind == 8:
        return {"type": "string", "format": rng.choice(["email", "date-time", "regex", "uri", "ipv4", "made-up"])}
    if kind == 9:
        return {"if": fuzz_schema(rng, depth + 1), "then": fuzz_schema(rng, depth + 1), "else": {"$ref": "#"}}
    if kind == 10:
        return {"properties": rng.choice([[], "x", {"a": fuzz_schema(rng, depth + 1)}]), "required": rng.choice([["a"], "a", [1]])}
    return {"type": "object", "properties": {f"p{i}": fuzz_schema(rng, depth + 1) for i in range(rng.randrange(4))},
            "required": [f"p{i}" for i in range(rng.randrange(3))]}


def fuzz_tools(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    tools = []
    for i in range(count):
        # the SDK parses a listing whole and checks the top level's `properties` / `required` types: one
        # bad tool there fails the server's start (reported); below the top level anything goes
        top = {k: v for k, v in fuzz_schema(rng).items() if k not in ("type", "properties", "required")}
        schema = {"type": "object", "properties": {"p0": fuzz_schema(rng), "s": fuzz_schema(rng)},
                  "required": rng.choice([[], ["p0"], ["s"]]), **top}
        if rng.random() < 0.3:
            schema["$defs"] = {"a": rng.choice([{"$ref": "#/$defs/a"}, {"type": "integer"}, {"$ref": "#"}])}
        tools.append({"name": f"t{i}", "inputSchema": schema,
                      "outputSchema": rng.choice([None, {"type": "object"}, {"type": "object", "required": ["x"]}])})
    return [{k: v for k, v in tool.items() if v is not None} for tool in tools]


def fuzz_reply(rng: random.Random, message_id) -> bytes | None:
    """One hostile answer to a tools/call (`None`: never answer)."""
    ok = {"content": [{"type": "text", "text": "fine"}], "isError": False}
    kind = rng.randrange(16)
    line = {"jsonrpc": "2.0", "id": message_id}
    if kind == 0:
        return None
    if kind == 1:
        return b"not json at all\n" + reply(message_id, ok)
    if kind == 2:
        return reply(message_id, {"content": "not a list"})
    if kind == 3:
        depth = rng.choice([50, 400, 5000])
        return (json.dumps(line)[:-1] + ', "result": {"content": [], "structuredContent": {"v": '
                + "[" * depth + "]" * depth + "}}}\n").encode()
    if kind == 4:
        return reply(message_id, {"content": [{"type": "text", "text": "x" * rng.choice([10, 100_000, 1_000_000])}]})
    if kind == 5:
        return (json.dumps({**line, "error": {"code": rng.choice([-32000, -32603, 1, 0]), "message": "nope"}}) + "\n").encode()
    if kind == 6:
        return reply(message_id + 1000 if isinstance(message_id, int) else "other", ok) + reply(message_id, ok)
    if kind == 7:
        return reply(message_id, ok) + reply(message_id, ok)  # answered twice
    if kind == 8:
        return reply(message_id, None)
    if kind == 9:
        return b'{"jsonrpc": "2.0", "id": ' + json.dumps(message_id).encode() + b', "result": {"content": [{"type": "text", "text": "\xff\xfe"}]}}\n'
    if kind == 10:
        return reply(message_id, {"content": [{"type": "image", "data": "!!", "mimeType": "x"}], "isError": "yes"})
    if kind == 11:
        return reply(message_id, {"content": [], "structuredContent": fuzz_value(rng)})
    if kind == 12:
        notes = b"".join(json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                     "params": {"level": "info", "data": "spam"}}).encode() + b"\n" for _ in range(50))
        return notes + reply(message_id, ok)
    if kind == 13:
        return reply(message_id, {"content": [{"type": "text"}]})  # text missing
    if kind == 14:
        return (json.dumps(line)[:-1] + ', "result": ' + json.dumps({"content": [{"type": "text", "text": "nan"}],
                                                                      "structuredContent": {"v": float("nan")}}) + "}\n").encode()
    return reply(message_id, ok)


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
    rng = random.Random(behaviour.get("fuzz_seed", 0))
    if "fuzz_seed" in behaviour:
        behaviour["tools"] = fuzz_tools(behaviour["fuzz_seed"], behaviour.get("fuzz_tools", 100))
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
        marker = behaviour.get("hang_if_exists")
        if method == "initialize" and marker and os.path.exists(marker):
            time.sleep(3600)
        if method == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "raw", "version": "0"}}
        elif method == "tools/list":
            result = {"tools": behaviour.get("tools", [{"name": "echo", "inputSchema": {"type": "object"}}])}
            relist = behaviour.get("relist_if_exists")
            if relist and os.path.exists(relist["file"]):
                result = {"tools": relist["tools"]}
        elif method == "tools/call":
            name = message["params"]["name"]
            sys.stderr.write(f"call {name}\n")
            sys.stderr.flush()
            if "fuzz_seed" in behaviour:
                answer = fuzz_reply(rng, message_id)
                if answer is not None:
                    out.write(answer)
                    out.flush()
                continue
            action = behaviour.get("calls", {}).get(name, "ok")
            if action == "exit":
                if behaviour.get("hang_if_exists"):
                    open(behaviour["hang_if_exists"], "w").close()
                if behaviour.get("relist_if_exists"):
                    open(behaviour["relist_if_exists"]["file"], "w").close()
                sys.exit(3)
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
