"""A to-do list MCP server: the small server `envace traces import` is shown with (docs/traces.md).

Four tools with honest annotations: `list_todos` and `get_todo` read, `add_todo` writes (nothing is
lost), `delete_todo` destroys. State lives in memory, one list per server object, starting from three
to-dos; an unknown id is an `isError` result that names it (`ToolError`: a plain exception would
reach the client as "Error executing tool ..." without its message).

    python examples/todo_server.py          # stdio (examples/todo.json launches it so)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
ADD = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
DELETE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)

STARTING_TODOS = [
    {"id": "t1", "title": "File my taxes", "priority": "high", "done": False},
    {"id": "t2", "title": "Buy milk", "priority": "normal", "done": False},
    {"id": "t3", "title": "Book the dentist", "priority": "low", "done": True},
]

TodoId = Annotated[str, Field(description="A to-do's id, e.g. 't2'", min_length=1)]
Priority = Literal["low", "normal", "high"]


class Todo(BaseModel):
    id: str
    title: str
    priority: Priority
    done: bool


class TodoList(BaseModel):
    todos: list[Todo]


class Deleted(BaseModel):
    id: str
    title: str
    remaining: int


def build_server(todos: list[dict[str, Any]] | None = None) -> MCPServer:
    """A fresh server holding `todos` (default: `STARTING_TODOS`); `server.todos` is its live state."""
    server = MCPServer("todo", instructions="A to-do list.", version="0.1.0", log_level="WARNING")
    state: dict[str, Todo] = {t["id"]: Todo(**t) for t in (STARTING_TODOS if todos is None else todos)}
    server.todos = state  # type: ignore[attr-defined]  # tests read it
    numbers = [int(i[1:]) for i in state if i[1:].isdigit()]
    counter = iter(range(max(numbers, default=0) + 1, 1 << 62))

    def find(todo_id: str) -> Todo:
        if todo_id not in state:
            raise ToolError(f"no to-do with id {todo_id!r}")
        return state[todo_id]

    @server.tool(annotations=READ)
    def list_todos(done: Annotated[bool | None, Field(description="only done (true) or open (false) ones")] = None
                   ) -> TodoList:
        """List the to-dos, optionally only the done or the open ones."""
        return TodoList(todos=[t for t in state.values() if done is None or t.done == done])

    @server.tool(annotations=READ)
    def get_todo(id: TodoId) -> Todo:  # noqa: A002 - the argument's name is the tool's interface
        """Get one to-do by its id."""
        return find(id)

    @server.tool(annotations=ADD)
    def add_todo(title: Annotated[str, Field(min_length=1, max_length=200)], priority: Priority = "normal") -> Todo:
        """Add an open to-do and return it with its new id."""
        todo = Todo(id=f"t{next(counter)}", title=title, priority=priority, done=False)
        state[todo.id] = todo
        return todo

    @server.tool(annotations=DELETE)
    def delete_todo(id: TodoId) -> Deleted:  # noqa: A002
        """Delete a to-do for good. Fails for an id that does not exist (or no longer does)."""
        todo = state.pop(find(id).id)
        return Deleted(id=todo.id, title=todo.title, remaining=len(state))

    return server


if __name__ == "__main__":
    build_server().run("stdio")
