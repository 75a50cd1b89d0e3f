"""BFCL-v4 multi-turn backends as an MCP server (a bridge; the backends are bfcl-eval's own code).

    pip install 'envace-mcp[bfcl]'
    python -P -m envace_mcp.servers.bfcl [--transport stdio|http] [--port N]

BFCL's multi-turn categories run an agent against eight stateful Python APIs (a file system, a
trading bot, a travel agency, a vehicle, messaging, posting, tickets, maths). This server publishes
every public method of those classes as an MCP tool, with the JSON schemas of BFCL's own function
docs (BFCL's `dict` / `float` / `tuple` types as JSON Schema's `object` / `number` / `array`).

State is per episode, as on the bundled servers: each call carries `_meta` `envace/episode` (a key) and
`envace/task` (a BFCL test id). On an episode's first call, the task's involved classes are created
and loaded with its `initial_config` (`long_context` for that category), exactly as bfcl-eval's checker
does; a call to a method of a class the task does not involve is an error. Results are rendered the
way bfcl-eval renders them for the model: strings as they are, dicts as JSON, anything else `str()`;
exceptions as `Error during execution: ...` with `isError`.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from envace_mcp.envs.episode import EPISODE_KEY, TASK_KEY

from ._common import meta_dict

CLASSES = ("GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot", "TravelAPI",
           "VehicleControlAPI")
"""The classes of the multi-turn categories (memory and web search belong to BFCL's agentic ones)."""
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def _bfcl() -> Any:
    try:
        return importlib.import_module("bfcl_eval")
    except ImportError as exc:
        from envace_mcp.errors import UserError

        raise UserError("the BFCL suites need the bfcl-eval package: pip install 'envace-mcp[bfcl]' "
                        "(installs it without its model-client dependencies)") from exc


def data_dir() -> Path:
    return Path(_bfcl().__file__).with_name("data")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of one of bfcl-eval's data files (one JSON object per line)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@cache
def function_docs() -> dict[str, list[dict[str, Any]]]:
    """Each class's BFCL function docs."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    docs = {}
    for cls in CLASSES:
        path = data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls]
        docs[cls] = read_jsonl(path)
    return docs


@cache
def entries() -> dict[str, dict[str, Any]]:
    """Every multi-turn test entry by id, across the four categories."""
    return {entry["id"]: entry for category in CATEGORIES
            for entry in read_jsonl(data_dir() / f"BFCL_v4_multi_turn_{category}.json")}


def json_schema(bfcl: Any) -> Any:
    """A BFCL parameter schema as JSON Schema."""
    if isinstance(bfcl, list):
        return [json_schema(v) for v in bfcl]
    if not isinstance(bfcl, dict):
        return bfcl
    out = {}
    for key, value in bfcl.items():
        if key == "type" and isinstance(value, str):
            mapped = _TYPES.get(value, value)
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: json_schema(v) for name, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = json_schema(value)
        else:
            out[key] = value
    return out


@cache
def owner_of() -> dict[str, str]:
    """Method name -> class, over the multi-turn classes (their names do not collide)."""
    return {doc["name"]: cls for cls, docs in function_docs().items() for doc in docs}


class Episodes:
    """Per-episode instances of a task's involved classes, created lazily, bounded (LRU)."""

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self._episodes: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def instances(self, episode: str, task_id: str) -> dict[str, Any]:
        if episode in self._episodes:
            self._episodes.move_to_end(episode)
            return self._episodes[episode]
        entry = entries().get(task_id)
        if entry is None:
            raise KeyError(f"unknown BFCL multi-turn test id {task_id!r}")
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        made = {}
        for cls in entry["involved_classes"]:
            instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls]), cls)()
            if cls not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(entry["initial_config"].get(cls, {})),
                                        long_context="long_context" in task_id)
            made[cls] = instance
        self._episodes[episode] = made
        while len(self._episodes) > self.capacity:
            self._episodes.popitem(last=False)
        return made


def render(value: Any) -> str:
    """A method's return value as bfcl-eval shows it to the model."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def build_server() -> Any:
    """A fresh bridge server with its own episodes (in-process for tests and fast rollouts)."""
    from mcp import types
    from mcp.server.lowlevel import Server

    episodes = Episodes()
    tools = [types.Tool(name=doc["name"], description=doc.get("description", ""),
                        input_schema=json_schema(doc.get("parameters") or {"type": "dict", "properties": {}}))
             for docs in function_docs().values() for doc in docs]
    owners = owner_of()

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        meta = meta_dict(getattr(params, "meta", None))
        try:
            task_id = meta.get(TASK_KEY)
            if not task_id:
                raise KeyError("this server needs `_meta` 'envace/task' (a BFCL multi-turn test id) on every call")
            made = episodes.instances(str(meta.get(EPISODE_KEY) or task_id), str(task_id))
            cls = owners.get(params.name)
            if cls is None or cls not in made:
                raise KeyError(f"Tool '{params.name}' is not available in this task")
            text, error = render(getattr(made[cls], params.name)(**(params.arguments or {}))), False
        except Exception as exc:  # noqa: BLE001 - bfcl-eval reports every failure to the model this way
            text, error = f"Error during execution: {exc}", True
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)

    server = Server("bfcl", version="0.1.0", instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool)
    server.episodes = episodes  # type: ignore[attr-defined]
    return server


INSTRUCTIONS = ("You carry out the user's requests by calling the available functions. Call a function when a "
                "request needs one; when a request lacks a required value or no function can do it, say so "
                "instead of guessing. Answer briefly when the request is done.")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="BFCL-v4 multi-turn backends as an MCP server (envace-mcp)")
    parser.add_argument("--transport", choices=["stdio", "http", "streamable-http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    server = build_server()
    import anyio

    if args.transport == "stdio":
        from mcp.server.stdio import stdio_server

        async def run() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(run)
    else:
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
