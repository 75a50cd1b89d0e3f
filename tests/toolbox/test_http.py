"""The toolbox over streamable HTTP on loopback, against real server subprocesses."""

import subprocess
import sys

import anyio
import pytest

from helpers import PROBE
from envace_mcp.envs import get_suite, run_reference
from envace_mcp.envs.launch import free_port, wait_for_port
from envace_mcp.toolbox import Toolbox

pytestmark = pytest.mark.anyio


@pytest.fixture
def probe_http():
    port = free_port()
    proc = subprocess.Popen([sys.executable, PROBE, "http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, proc, 30)
        yield proc, f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


async def test_calls_timeouts_and_validation_work_over_http(probe_http):
    _, url = probe_http
    async with Toolbox({"mcpServers": {"probe": {"url": url, "headers": {"X-Test": "1"}}}}) as toolbox:
        assert toolbox.catalog["echo"].annotations.read_only
        ok = await toolbox.call("echo", {"text": "over http", "count": 1})
        bad = await toolbox.call("echo", {"text": "x", "count": 0})
        with anyio.fail_after(15):
            hung = await toolbox.call("hang", {}, timeout=0.5)
        after = await toolbox.call("echo", {"text": "after"})
    assert ok.structured_content == {"text": "over http", "count": 1}
    assert bad.error_kind == "invalid_arguments" and hung.error_kind == "timeout" and not after.is_error


async def test_a_dead_http_server_gives_server_died_results_not_exceptions(probe_http):
    proc, url = probe_http
    async with Toolbox({"probe": {"url": url}}, timeout=10) as toolbox:
        assert not (await toolbox.call("echo", {"text": "x"})).is_error
        proc.kill()
        proc.wait()
        first = await toolbox.call("echo", {"text": "x"})
        second = await toolbox.call("echo", {"text": "x"})
    assert first.error_kind == "server_died"
    assert second.error_kind == "server_died"


async def test_concurrent_episodes_on_one_http_server_stay_isolated():
    suite = get_suite("retail")
    tasks = [t for t in suite.split("test") if t.write_actions][:12]
    with suite.serve_http() as url:
        async with Toolbox({"retail": {"url": url}}) as toolbox:
            verdicts = {}

            async def solve(task):
                _, verdicts[task.id] = await run_reference(toolbox, suite, task)

            async with anyio.create_task_group() as tg:
                for task in tasks:
                    tg.start_soon(solve, task)
    assert len(verdicts) == 12 and all(v.score == 1.0 for v in verdicts.values())
