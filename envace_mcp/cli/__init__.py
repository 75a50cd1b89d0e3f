"""The `envace` command.

    envace demo                          # list the bundled servers' tools, solve a test task over stdio
    envace servers ls [--servers mcp.json] [--json]
    envace servers config                # an mcpServers JSON for the bundled servers
    envace servers serve bank --transport http --port 8001
    envace tasks ls bank --split test
    envace tasks show bank/test/0004
    envace call get_balance '{"account_id": "CHK-1"}' --servers mcp.json
    envace eval --suite bank --split test --limit 12 --out runs/bank [--compare rehearse=2]
    envace compare runs/bank runs/bank-grpo [--out runs/cmp]   # pair two saved evaluations by task
"""

from __future__ import annotations

from envace_mcp.cli import agent, evaluation, policy, servers, traces, train  # noqa: F401 - they register the commands
from envace_mcp.cli._common import (
    app,
    policy_app,
    servers_app,
    tasks_app,
    traces_app,
    train_app,
)

app.add_typer(servers_app, name="servers")
app.add_typer(tasks_app, name="tasks")
app.add_typer(policy_app, name="policy")
app.add_typer(traces_app, name="traces")
app.add_typer(train_app, name="train")


def main(argv: list[str] | None = None) -> None:
    """The console script: a bad argument is one `error:` line naming it, exit code 2, before any model
    or server starts (Click's usage errors otherwise print a boxed, multi-line message)."""
    import sys

    import typer
    from rich.text import Text

    from envace_mcp.cli._common import err_console

    try:
        code = app(args=argv, prog_name="envace", standalone_mode=False)
    except typer.Abort:
        err_console.print("aborted")
        code = 1
    except typer.TyperException as exc:  # Click's usage and file errors (typer vendors Click)
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()  # type: ignore[attr-defined]
            code = 0
        else:
            ctx = getattr(exc, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            message = exc.format_message().replace(": Value error, ", ": ")  # type: ignore[attr-defined]
            err_console.print(Text.assemble(("error: ", "bold red"), where + message))
            code = getattr(exc, "exit_code", 2)
    sys.exit(code if isinstance(code, int) else 0)
