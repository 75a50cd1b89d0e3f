"""The `envace` command.

    envace demo                          # list the bundled servers' tools, solve a test task over stdio
    envace servers ls [--servers mcp.json] [--json]
    envace servers config                # an mcpServers JSON for the bundled servers
    envace servers serve bank --transport http --port 8001
    envace tasks ls bank --split test
    envace tasks show bank/test/0004
    envace call get_balance '{"account_id": "CHK-1"}' --servers mcp.json
    envace eval --suite bank --split test --limit 12 --out runs/bank [--compare rehearse=2]
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


def main() -> None:
    app()
