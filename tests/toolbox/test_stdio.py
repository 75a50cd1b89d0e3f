"""The toolbox over real stdio subprocesses: restarts, shutdown, environment, peers."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import pytest

from helpers import PROBE, alive, children_of, logged_calls, wait_until
from envace_mcp.toolbox import ServerStartError, Toolbox

pytestmark = pytest.mark.anyio


async def test_one_persistent_process_serves_every_call(probe_stdio, probe_log):
    async with Toolbox({"probe": probe_stdio}) as toolbox:
        pids = {(await toolbox.call("pid")).structured_content["result"] for _ in range(5)}
        for i in range(20):
            assert not (await toolbox.call("echo", {"text": str(i)})).is_error
    assert len(pids) == 1
    assert {c["pid"] for c in logged_calls(probe_log)} == pids


async def test_a_server_killed_mid_run_is_restarted_on_the_next_call(probe_stdio):
    async with Toolbox({"probe": probe_stdio}) as toolbox:
        first = (await toolbox.call("pid")).structured_content["result"]
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: not alive(first))
        hit = await toolbox.call("echo", {"text": "x"})
        assert hit.error_kind == "server_died" and hit.structured_content["restart_on_next_call"]
        again = await toolbox.call("echo", {"text": "back"})
        assert not again.is_error and again.structured_content["text"] == "back"
        second = (await toolbox.call("pid")).structured_content["result"]
        assert second != first and toolbox.restarts("probe") == 1


async def test_a_server_dying_during_a_call_returns_server_died_not_an_exception(probe_stdio):
    async with Toolbox({"probe": probe_stdio}) as toolbox:
        died = await toolbox.call("die")
        assert died.error_kind == "server_died" and died.is_error
        assert not (await toolbox.call("echo", {"text": "x"})).is_error


async def test_a_hung_stdio_tool_times_out_and_the_session_stays_usable(probe_stdio):
    async with Toolbox({"probe": probe_stdio}) as toolbox:
        with anyio.fail_after(15):
            hung = await toolbox.call("hang", {}, timeout=0.5)
        assert hung.error_kind == "timeout"
        assert not (await toolbox.call("echo", {"text": "x"})).is_error
        assert toolbox.restarts("probe") == 0


async def test_invalid_arguments_never_reach_a_stdio_server(probe_stdio, probe_log):
    async with Toolbox({"probe": probe_stdio}) as toolbox:
        for bad in ({}, {"text": 1}, {"text": "x", "count": 0}, {"text": "x", "count": "2"}, ["x"]):
            assert (await toolbox.call("echo", bad)).error_kind == "invalid_arguments"
        await toolbox.call("echo", {"text": "ok"})
    assert [c["arguments"] for c in logged_calls(probe_log)] == [{"text": "ok", "count": 1}]


async def test_no_server_process_outlives_the_toolbox(probe_stdio):
    async with Toolbox({"a": probe_stdio, "b": probe_stdio}) as toolbox:
        pids = {(await toolbox.call(f"{s}_pid")).structured_content["result"] for s in ("a", "b")}
        assert len(pids) == 2 and pids <= children_of(os.getpid())
    assert wait_until(lambda: not any(alive(p) for p in pids))


async def test_no_server_process_outlives_an_exception_in_the_caller(probe_stdio):
    pids = set()
    with pytest.raises(ZeroDivisionError):
        async with Toolbox({"probe": probe_stdio}) as toolbox:
            pids.add((await toolbox.call("pid")).structured_content["result"])
            1 / 0  # noqa: B018
    assert pids and wait_until(lambda: not any(alive(p) for p in pids))


def test_no_server_process_outlives_ctrl_c(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import anyio, faulthandler, signal, sys
        from envace_mcp.toolbox import Toolbox
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for stacks if it hangs
        # Ctrl-C as at a terminal: a shell's background job (CI launched with `&`) inherits SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        async def main():
            async with Toolbox({{"probe": {{"command": sys.executable, "args": [{PROBE!r}]}}}}) as toolbox:
                pid = (await toolbox.call("pid")).structured_content["result"]
                print(pid, flush=True)
                await anyio.sleep(3600)
        anyio.run(main)
    """))
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as err:  # a file, not a pipe: a full pipe could block the agent's exit
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            server_pid = int(proc.stdout.readline())
            assert alive(server_pid)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGUSR1)
                time.sleep(2)
                pytest.fail(f"the agent did not exit within 60 s of Ctrl-C; its stderr:\n{errors.read_text()[-3000:]}")
        finally:
            proc.kill()
    assert "KeyboardInterrupt" in errors.read_text()
    assert wait_until(lambda: not alive(server_pid))


async def test_the_child_environment_is_an_allowlist(probe_stdio, monkeypatch):
    monkeypatch.setenv("ENVACE_TEST_SECRET", "hunter2")
    async with Toolbox({"probe": probe_stdio}) as toolbox:
        names = (await toolbox.call("environment")).structured_content["result"]
    assert "ENVACE_TEST_SECRET" not in names
    assert "PROBE_LOG" in names and "PATH" in names


async def test_a_server_that_cannot_start_fails_open_with_its_stderr():
    bad = {"command": sys.executable, "args": ["-c", "import sys; sys.stderr.write('boom: no config'); sys.exit(4)"]}
    with pytest.raises(ServerStartError, match="boom: no config"):
        async with Toolbox({"broken": bad}):
            pass
    with pytest.raises(ServerStartError, match="'missing'"):
        async with Toolbox({"missing": {"command": "/nonexistent/server-binary"}}):
            pass


async def test_a_peer_written_without_the_sdk_on_an_older_protocol_works(tmp_path):
    """tau2-mock-mcp-eval: a hand-written JSON-RPC stdio server speaking protocol 2025-06-18."""
    import tau2_mock_mcp  # noqa: F401 - a test dependency; its absence must fail, not skip

    env = {"TAU2_MOCK_MCP_STATE_DIR": str(tmp_path)}
    config = {"tau2": {"command": sys.executable, "args": ["-m", "tau2_mock_mcp.server"], "env": env}}
    async with Toolbox(config) as toolbox:
        names = set(toolbox.catalog.names)
        assert {"create_task", "get_users", "update_task_status"} <= names
        assert toolbox.catalog["get_users"].output_schema is None
        created = await toolbox.call("create_task", {"state_key": "k1", "user_id": "user_1", "title": "Write tests"})
        assert not created.is_error, created.text
        mine = await toolbox.call("get_users", {"state_key": "k1"})
        fresh = await toolbox.call("get_users", {"state_key": "k2"})
        invalid = await toolbox.call("create_task", {"state_key": "k1", "title": 5})
    assert "task_2" in json.dumps(mine.value) and "task_2" not in json.dumps(fresh.value)
    assert invalid.error_kind == "invalid_arguments"
