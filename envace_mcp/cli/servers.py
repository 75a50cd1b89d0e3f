"""Servers, tasks and single tool calls."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional

import anyio
import typer
from rich.table import Table

from envace_mcp.cli._common import (
    ServersOpt,
    _bundled_config,
    _catalog_table,
    _fail,
    _positive,
    _suite,
    app,
    console,
    servers_app,
    tasks_app,
)
from envace_mcp.errors import EnvaceError


@servers_app.command("ls")
def servers_ls(servers: ServersOpt = None, as_json: Annotated[bool, typer.Option("--json", help="print the catalog as JSON")] = False) -> None:
    """List every tool of the configured servers with schemas and annotations."""
    from envace_mcp.toolbox import Toolbox

    async def main() -> None:
        async with Toolbox(servers or _bundled_config()) as toolbox:
            if as_json:
                print(json.dumps(toolbox.catalog.to_dicts(), indent=2))
            else:
                console.print(_catalog_table(toolbox.catalog))

    try:
        anyio.run(main)
    except EnvaceError as exc:
        _fail(exc)


@servers_app.command("config")
def servers_config() -> None:
    """Print an `mcpServers` JSON that launches the bundled servers over stdio."""
    print(json.dumps(_bundled_config(), indent=2))


@servers_app.command("serve")
def servers_serve(
    domain: Annotated[str, typer.Argument(help="bank or retail")],
    transport: Annotated[Literal["stdio", "http"], typer.Option(help="MCP transport")] = "stdio",
    host: Annotated[str, typer.Option(help="HTTP: the address to listen on (loopback unless --allow-remote)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port")] = 8000,
    seed: Annotated[int, typer.Option(help="seeds the server's starting data: the same seed, the same world")] = 0,
    allow_remote: Annotated[bool, typer.Option(
        "--allow-remote", help="serve HTTP on a --host other than loopback: the server has no authentication, so "
                               "anyone who can reach it can call every tool")] = False,
    allowed_host: Annotated[Optional[list[str]], typer.Option(
        "--allowed-host", help="a Host header clients may send besides --host (repeatable; needed with "
                               "--host 0.0.0.0)")] = None,
) -> None:
    """Run a bundled server in the foreground.

    Over HTTP every request's Host header must name the server (and a browser's Origin too), against DNS
    rebinding; a --host off loopback needs --allow-remote, since the server has no authentication.
    """
    from envace_mcp.cli._common import err_console
    from envace_mcp.servers.security import http_security, is_loopback, remote_refusal

    allowed = allowed_host or []
    refusal = remote_refusal(host, allow_remote, allowed) if transport == "http" else None
    if refusal:
        _fail(ValueError(refusal))
    suite = _suite(domain, seed)
    if transport == "stdio":
        suite.server_module.main(["--transport", "stdio", "--seed", str(seed)])
        return
    if allow_remote and not is_loopback(host):
        from rich.text import Text

        err_console.print(Text(f"warning: serving {domain} over HTTP on {host}:{port} with no authentication: anyone "
                               "who can reach it can call every tool, destructive ones included"))
    suite.server_module.build_server(seed=seed).run("streamable-http", host=host, port=port,
                                                    transport_security=http_security(host, allowed))


@tasks_app.command("ls")
def tasks_ls(
    domain: Annotated[str, typer.Argument(help="bank or retail")],
    split: Annotated[Optional[Literal["train", "test"]], typer.Option(help="only this split")] = None,
    limit: Annotated[int, typer.Option(min=1, help="rows shown")] = 20,
) -> None:
    """List tasks of a bundled suite."""
    suite = _suite(domain)
    tasks = [t for t in suite.tasks if split is None or t.split == split]
    table = Table(title=f"{domain}: {len(tasks)} tasks" + (f" ({split})" if split else ""))
    for col in ("id", "kind", "outcome", "calls", "instruction"):
        table.add_column(col)
    for task in tasks[:limit]:
        table.add_row(task.id, task.kind, task.outcome, str(len(task.actions)), task.instruction)
    console.print(table)


@tasks_app.command("show")
def tasks_show(task_id: str) -> None:
    """Show one task: instruction, reference actions, expected answer."""
    try:
        task = _suite(task_id.split("/")[0]).task(task_id)
    except EnvaceError as exc:
        _fail(exc)
    console.print(f"[bold]{task.id}[/] ({task.kind}, {task.outcome})\n{task.instruction}\n")
    for i, action in enumerate(task.actions, 1):
        console.print(f"  {i}. {action.tool}({json.dumps(action.arguments)})")
    if task.trap:
        console.print(f"  [red]trap:[/] {task.trap.tool}({json.dumps(task.trap.arguments)})")
    console.print(f"\nanswer: {task.answer}")


@app.command("call")
def call(
    tool: str,
    arguments: Annotated[str, typer.Argument(help="JSON object of arguments")] = "{}",
    servers: ServersOpt = None,
    timeout: Annotated[float, typer.Option(callback=_positive, help="seconds before the call gives up")] = 60.0,
) -> None:
    """Call one tool and print its result (errors are printed as data, exit code 1). A tool that asks
    for input mid-call is answered at the terminal, field by field."""
    from envace_mcp.toolbox import Toolbox

    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        _fail(ValueError(f"arguments are not JSON: {exc}"))
    if not isinstance(args, dict):
        _fail(ValueError(f"arguments must be a JSON object, not {type(args).__name__}"))

    async def main() -> Any:
        from envace_mcp._transcript import TerminalApprover
        from envace_mcp.cli._common import err_console
        from envace_mcp.graph.acting import ask_answers
        from envace_mcp.graph.calls import Proposal
        from envace_mcp.policy.types import ToolCall

        async with Toolbox(servers or _bundled_config(), timeout=timeout) as toolbox:
            result = await toolbox.call(tool, args)
            person = TerminalApprover(err_console)  # stdout stays the JSON result
            call = Proposal(ToolCall(id="call", name=tool, arguments=args), toolbox.catalog.get(tool))
            while result.input_required is not None:  # the server asks; no answer (no terminal) ends the call
                waiting = result.input_required
                answer = await ask_answers(person, call, waiting["questions"], waiting["round"])
                if answer.responses is None:
                    break
                result = await toolbox.respond(result, answer.responses)
            return result

    try:
        result = anyio.run(main)
    except EnvaceError as exc:
        _fail(exc)
    print(json.dumps(result.model_dump(mode="json"), indent=2))
    raise typer.Exit(1 if result.is_error else 0)
