"""Connect to the bundled bank server over stdio, list its tools, make a good call and a bad one.

    python examples/toolbox_quickstart.py
"""

import sys

import anyio

from envace_mcp import Toolbox
from envace_mcp.envs import Episode, get_suite


async def main() -> None:
    config = {"mcpServers": {"bank": {"command": sys.executable, "args": ["-P", "-m", "envace_mcp.servers.bank"]}}}
    task = get_suite("bank").split("test")[0]
    async with Toolbox(config) as toolbox:
        for tool in toolbox.catalog:
            kind = "read-only" if tool.annotations.read_only else "destructive" if tool.annotations.destructive else "write"
            print(f"{tool.name:15} {kind:12} {tool.description}")
        # One episode of one task: the server builds that task's world for this key, privately.
        episode = toolbox.scoped(Episode(task, "bank").meta)
        print(f"\ntask: {task.instruction}")
        first = task.actions[0]
        good = await episode.call(first.tool, first.arguments)
        print(f"{first.tool}({first.arguments}) -> {good.structured_content}")
        bad = await episode.call("transfer", {"from_account_id": "CHK-1", "amount": "lots"})
        print(f"bad transfer -> {bad.error_kind}: {bad.text}")


if __name__ == "__main__":
    anyio.run(main)
