"""A to-do server of a user's own, for the tests of runs that cannot progress (tests/graph/test_stalled_runs.py)
and of `envace policy try --servers` (tests/cli/test_policy_try.py).

    python tests/todo_server.py      # stdio; TODO_STATE: a JSON file holding the to-dos across processes

`list_todos` and `get_todo` are read-only, `delete_todo` is destructive, as annotated. An unknown id is
an `isError` result naming it. With TODO_STATE each call reads and writes that file, so a test can see
what a process that has exited did (or did not do) to the server's state.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel

TODOS = {"t1": {"id": "t1", "title": "File my taxes", "done": False},
         "t2": {"id": "t2", "title": "Buy milk", "done": False}}


class Todo(BaseModel):
    id: str
    title: str
    done: bool


class Todos(BaseModel):
    todos: list[Todo]


class Deleted(BaseModel):
    deleted: str
    remaining: int


def build(todos: dict[str, Any] | None = None) -> MCPServer:
    server = MCPServer("todo", log_level="WARNING")
    memory = dict(TODOS if todos is None else todos)
    server.todos = memory  # type: ignore[attr-defined]  # in-process tests read it
    stored = os.environ.get("TODO_STATE")

    def load() -> dict[str, Any]:
        return json.loads(Path(stored).read_text()) if stored and Path(stored).exists() else memory

    def save(state: dict[str, Any]) -> None:
        if stored:
            Path(stored).write_text(json.dumps(state))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def list_todos() -> Todos:
        """List every to-do."""
        return Todos(todos=[Todo(**t) for t in load().values()])

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def get_todo(id: str) -> Todo:  # noqa: A002 - the argument's name is the tool's interface
        """Get one to-do by its id."""
        state = load()
        if id not in state:
            raise ToolError(f"no to-do with id {id!r}")
        return Todo(**state[id])

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    def delete_todo(id: str) -> Deleted:  # noqa: A002
        """Delete a to-do for good."""
        state = load()
        if id not in state:
            raise ToolError(f"no to-do with id {id!r}")
        gone = state.pop(id)
        save(state)
        return Deleted(deleted=gone["id"], remaining=len(state))

    return server


if __name__ == "__main__":
    build().run("stdio")
