"""An MCP server whose tools run as tasks: the 2026-07-28 tasks extension (`io.modelcontextprotocol/tasks`).

The SDK ships no tasks implementation, so this serves the extension its way: an `Extension` that answers
`tools/call` of a task tool with a task handle (only to a client that declared the extension, as the
spec requires) and serves `tasks/get` and `tasks/cancel`. A task's work runs when it is created;
`tasks/get` reports it `working` for its plan's number of polls, then how it ends: deterministic, no
clocks. Some plans lie. The `stats` tool (not a task) is the server's witness: tasks created, polls,
cancels. Run in-process (`build()`) or over HTTP (`python tests/servers/task_server.py http PORT`).
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from typing import Any

from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp_types import RequestParams, ToolAnnotations

EXTENSION = "io.modelcontextprotocol/tasks"
HOSTILE = "\x1b[2J\x1b]0;pwned\x07" + "A" * 100_000


@dataclass(frozen=True)
class Plan:
    polls: int | None = 1
    """The `tasks/get` poll that sees the task end; `None`: it never ends."""
    poll_interval_ms: Any = 1
    ending: str = "completed"
    message: str | None = None
    lie: str | None = None
    """"status": tasks/get reports a status the extension does not have; "task_id": another task's id."""


PLANS = {
    "report": Plan(polls=2),
    "wipe": Plan(),
    "forever": Plan(polls=None),
    "patient": Plan(polls=2, poll_interval_ms=300),
    "sleepy": Plan(poll_interval_ms=10**9),
    "crash": Plan(ending="failed", message=HOSTILE),
    "refused": Plan(ending="cancelled", message="operator said no"),
    "shifty": Plan(lie="status"),
    "impostor": Plan(lie="task_id"),
}


class TaskIdParams(RequestParams):
    task_id: str


class Tasks(Extension):
    identifier = EXTENSION

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []
        self.polls = 0
        self.cancels: list[str] = []

    def methods(self) -> list[MethodBinding]:
        return [MethodBinding("tasks/get", TaskIdParams, self.get),
                MethodBinding("tasks/cancel", TaskIdParams, self.cancel)]

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        caps = ctx.session.client_capabilities
        if params.name not in PLANS or not (caps and caps.extensions and EXTENSION in caps.extensions):
            return await call_next(ctx)
        result = await call_next(ctx)
        task_id = str(uuid.uuid4())
        self.created.append(params.name)
        self.tasks[task_id] = {"plan": PLANS[params.name], "polls": 0, "cancelled": False,
                               "result": result.model_dump(by_alias=True, mode="json", exclude_none=True)}
        return {"resultType": "task", **self._task(task_id, "working")}

    def _task(self, task_id: str, status: str, **extra: Any) -> dict[str, Any]:
        plan = self.tasks[task_id]["plan"]
        return {"taskId": task_id, "status": status, "createdAt": "2026-07-28T00:00:00Z",
                "lastUpdatedAt": "2026-07-28T00:00:00Z", "ttlMs": 60_000, "pollIntervalMs": plan.poll_interval_ms,
                **extra}

    async def get(self, ctx: Any, params: TaskIdParams) -> dict[str, Any]:
        self.polls += 1
        task = self.tasks[params.task_id]
        task["polls"] += 1
        plan: Plan = task["plan"]
        if task["cancelled"]:
            return self._task(params.task_id, "cancelled")
        if plan.lie == "status":
            return self._task(params.task_id, "exploding\x1b[31m")
        if plan.lie == "task_id":
            return {**self._task(params.task_id, "working"), "taskId": "someone-else"}
        if plan.polls is None or task["polls"] < plan.polls:
            return self._task(params.task_id, "working", statusMessage="still going")
        said = {"statusMessage": plan.message} if plan.message else {}
        if plan.ending == "failed":
            return self._task(params.task_id, "failed", error={"code": -32603, "message": "boom"}, **said)
        if plan.ending == "cancelled":
            return self._task(params.task_id, "cancelled", **said)
        return self._task(params.task_id, "completed", result=task["result"], **said)

    async def cancel(self, ctx: Any, params: TaskIdParams) -> dict[str, Any]:
        self.cancels.append(params.task_id)
        if params.task_id in self.tasks:
            self.tasks[params.task_id]["cancelled"] = True
        return {}


def build(name: str = "jobs") -> MCPServer:
    tasks = Tasks()
    server = MCPServer(name, log_level="WARNING", extensions=[tasks])
    server.tasks = tasks  # type: ignore[attr-defined]
    read_only = ToolAnnotations(read_only_hint=True)

    @server.tool(annotations=read_only)
    def report(text: str) -> str:
        """A long report on `text`."""
        return f"report on {text}: all good"

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def wipe(table: str) -> str:
        """Delete every row of a table (slowly)."""
        return f"wiped {table}"

    for tool in ("forever", "patient", "sleepy", "crash", "refused", "shifty", "impostor"):
        server.add_tool(lambda: "never seen", name=tool, description=f"a task tool that {tool}",
                        annotations=read_only)

    @server.tool(annotations=read_only)
    def stats() -> dict[str, Any]:
        """What the server saw: tasks created (by tool), tasks/get polls, tasks/cancel requests."""
        return {"created": tasks.created, "polls": tasks.polls, "cancels": len(tasks.cancels)}

    return server


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        build().run("streamable-http", port=int(sys.argv[2]))
    else:
        build().run("stdio")
