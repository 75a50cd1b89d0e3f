"""The bundled servers as users run them: subprocesses over stdio and streamable HTTP."""

import subprocess
import sys

import pytest

from envace_mcp.envs import get_suite, run_reference
from envace_mcp.toolbox import Toolbox

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("domain", ["bank", "retail"])
async def test_a_multi_step_test_task_is_solved_over_stdio(domain):
    suite = get_suite(domain)
    task = max(suite.split("test"), key=lambda t: len(t.actions))
    async with Toolbox({"mcpServers": {domain: suite.stdio_config()}}) as toolbox:
        episode, verdict = await run_reference(toolbox, suite, task)
        _, careless = await run_reference(toolbox, suite, task, drop_last_write=True)
    assert len(episode.results) >= 3 and not any(r.is_error for r in episode.results)
    assert verdict.score == 1.0 and careless.score < 1.0


async def test_both_servers_together_prefix_only_their_colliding_tools():
    config = {"mcpServers": {name: get_suite(name).stdio_config() for name in ("bank", "retail")}}
    async with Toolbox(config) as toolbox:
        names = set(toolbox.catalog.names)
        suite = get_suite("retail")
        task = next(t for t in suite.split("test") if t.kind == "cancel_pending")
        _, verdict = await run_reference(toolbox, suite, task, server="retail")
    assert {"bank_list_orders", "retail_list_orders", "bank_cancel_order", "retail_cancel_order"} <= names
    assert {"transfer", "get_order", "list_orders", "cancel_order"} & names == {"transfer", "get_order"}
    assert verdict.score == 1.0


async def test_the_bank_server_over_http_keeps_state_per_episode():
    suite = get_suite("bank")
    task = next(t for t in suite.split("test") if t.kind == "fund_and_buy")
    with suite.serve_http() as url:
        async with Toolbox({"bank": {"url": url}}) as toolbox:
            first, verdict = await run_reference(toolbox, suite, task)
            second, again = await run_reference(toolbox, suite, task)
    assert first.key != second.key and verdict.score == again.score == 1.0


def test_servers_run_as_modules_and_report_bad_flags():
    out = subprocess.run([sys.executable, "-m", "envace_mcp.servers.bank", "--transport", "pigeon"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "invalid choice" in out.stderr
