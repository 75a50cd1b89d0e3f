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
    envace lab --help                    # research tools: reference and probe traces, training mixes, plots
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer
import typer.core
import typer.rich_utils

from envace_mcp.cli import agent, evaluation, policy, servers, traces, train  # noqa: F401 - they register the commands
from envace_mcp.cli._common import (
    app,
    policy_app,
    servers_app,
    tasks_app,
    traces_app,
    train_app,
)
from envace_mcp.cli.lab import lab_app
from envace_mcp.cli.world_model import world_model_app

app.add_typer(servers_app, name="servers")
app.add_typer(tasks_app, name="tasks")
app.add_typer(policy_app, name="policy")
app.add_typer(traces_app, name="traces")
app.add_typer(train_app, name="train")
app.add_typer(world_model_app, name="world-model")
app.add_typer(lab_app, name="lab")

_LOG_WIDTH = 100_000
"""Help printed off a terminal is never wrapped: a log line per option, whatever its length."""


def _help_for_logs(rich_help: Any) -> Any:
    """Typer's help is rich panels at the terminal's width, and 80 columns when stdout is a file or a
    pipe, which cuts a log's option descriptions into slivers. Off a terminal (no COLUMNS or
    TERMINAL_WIDTH set, no colour forced) it is Click's plain help instead, unwrapped."""
    def format_help(*, obj: Any, ctx: Any, markup_mode: Any) -> None:
        asked_width = os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH")
        if sys.stdout.isatty() or asked_width or typer.rich_utils.FORCE_TERMINAL:
            return rich_help(obj=obj, ctx=ctx, markup_mode=markup_mode)
        formatter = ctx.make_formatter()
        formatter.width = _LOG_WIDTH
        mode, obj.rich_markup_mode = obj.rich_markup_mode, None  # the command's own Click formatting
        try:
            obj.format_help(ctx, formatter)
        finally:
            obj.rich_markup_mode = mode
        typer.echo(formatter.getvalue().rstrip("\n"))
    return format_help


def _no_type_on_flags(display_type: Any) -> Any:
    """An on/off flag takes no value: its help shows no type (Typer's rich help printed `<bool>`)."""
    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if self.is_flag or self.count else display_type(self, ctx)
    return display_type_rich


typer.rich_utils.rich_format_help = _help_for_logs(typer.rich_utils.rich_format_help)
typer.core.TyperOption.display_type_rich = _no_type_on_flags(typer.core.TyperOption.display_type_rich)  # type: ignore[method-assign]


RETIRED = {
    "--max-steps": "--limits max_steps=N", "--rehearse-max-new-tokens": "-c rehearse_max_new_tokens=N",
    "--strategy": "-c strategy=parallel|sequential", "--concurrency": "-c concurrency=N",
    "--temperature": "-c temperature=T", "--seed": "-c seed=N", "--constrain-calls": "-c constrain_calls=true",
    "--transport": "-c transport=inprocess|stdio|http", "--kind": "-c experimental.kinds=[A,B]",
    "--split": "-c split=train|fit", "--lr": "-c lr=X", "--batch-size": "-c batch_size=N", "--full": "-c lora=false",
    "--lora-r": "-c lora_r=N", "--min-reward": "-c min_reward=X", "--bf16": "-c performance.bf16=true",
    "--fp32": "-c performance.bf16=false", "--share-prefix": "-c performance.share_prefix=true",
    "--no-share-prefix": "-c performance.share_prefix=false", "--micro-batch": "-c performance.micro_batch=N",
    "--micro-tokens": "-c performance.micro_tokens=N", "--max-new-tokens": "-c max_new_tokens=N",
    "--rehearse-adapter": "--world-model", "--rehearse": "-c rehearse=N", "--role": "-c roles=[act] (or [rehearse])",
}
"""Options that moved into a settings model (`--limits`, `-c`), for the error an old command line meets,
where the command takes that door (a `-c` hint only where it has `-c`)."""

RETIRED_FROM = {"--rehearse": ("envace run", "envace eval"), "--role": ("envace train sft",),
                "--constrain-calls": ("envace run", "envace eval")}
"""Where a retired option's hint holds: the commands whose settings have that key (`train grpo` has no
`rehearse`, and `policy try` still has a `--role`)."""


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
            option = getattr(exc, "option_name", None)
            takes_config = ctx is not None and any("--config" in getattr(p, "opts", ()) for p in ctx.command.params)
            if (type(exc).__name__ == "NoSuchOption" and option in RETIRED  # Click's guess would mislead
                    and (takes_config or not RETIRED[option].startswith("-c"))
                    and (option not in RETIRED_FROM or ctx.command_path in RETIRED_FROM[option])):
                message = f"No such option: {option}; it is {RETIRED[option]} now"
            err_console.print(Text.assemble(("error: ", "bold red"), where + message))
            code = getattr(exc, "exit_code", 2)
    sys.exit(code if isinstance(code, int) else 0)
