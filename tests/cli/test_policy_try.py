"""`envace policy try --servers`: the world model on a user's own tool, run as users run it (a subprocess)
against a real stdio to-do server (tests/todo_server.py, its state in a file the test reads), with the
tiny Qwen3 for plumbing. A call that writes runs for real only on a server marked as a sandbox, or when
a person at a terminal says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import TESTS
from todo_server import TODOS

ENVACE = [sys.executable, "-m", "envace_mcp.cli"]
TODO_SERVER = str(TESTS / "todo_server.py")
NOT_RUN = ('not run: delete_todo is not read-only and server \'todo\' is not marked "sandbox": true, and there is no '
           "terminal to confirm on")


def envace(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The command off a terminal (stdin is not one), as in CI or a pipe."""
    return subprocess.run([*ENVACE, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


@pytest.fixture
def todo(tmp_path: Path):
    """(a servers file for the to-do server, the file holding its state, a sandbox servers file too)."""
    state = tmp_path / "todos.json"
    state.write_text(json.dumps(TODOS))

    def config(name: str, **extra: object) -> Path:
        entry = {"command": sys.executable, "args": [TODO_SERVER], "env": {"TODO_STATE": str(state)}, **extra}
        path = tmp_path / name
        path.write_text(json.dumps({"mcpServers": {"todo": entry}}))
        return path

    return config("mcp.json"), state, config("sandbox.json", sandbox=True)


def test_a_read_only_tool_shows_the_prediction_beside_the_real_result(todo, tiny_qwen3_dir):
    servers, _, _ = todo
    out = envace("policy", "try", "--servers", str(servers), "--tool", "get_todo", "--args", '{"id": "t1"}',
                 "--model", str(tiny_qwen3_dir))
    assert out.returncode == 0, out.stderr
    assert 'call: get_todo({"id": "t1"})  on todo (read-only)' in out.stdout
    assert f"rehearsed by {tiny_qwen3_dir}" in out.stdout and "real result from todo" in out.stdout
    assert '"title": "File my taxes"' in out.stdout and "fidelity:" in out.stdout


def test_a_destructive_tool_off_a_terminal_is_rehearsed_and_not_run(todo, tiny_qwen3_dir):
    servers, state, _ = todo
    out = envace("policy", "try", "--servers", str(servers), "--tool", "delete_todo", "--args", '{"id": "t1"}',
                 "--model", str(tiny_qwen3_dir))
    assert out.returncode == 0, out.stderr
    assert f"rehearsed by {tiny_qwen3_dir}" in out.stdout and "real result" not in out.stdout
    assert NOT_RUN in " ".join(out.stdout.split())  # one line (wrapped where the terminal is narrow)
    assert json.loads(state.read_text()) == TODOS
    read = envace("call", "get_todo", '{"id": "t1"}', "--servers", str(servers))  # the server still has it
    assert read.returncode == 0 and json.loads(read.stdout)["structured_content"]["title"] == "File my taxes"


def test_on_a_server_marked_as_a_sandbox_a_destructive_tool_runs(todo, tiny_qwen3_dir):
    _, state, sandbox = todo
    out = envace("policy", "try", "--servers", str(sandbox), "--tool", "delete_todo", "--args", '{"id": "t1"}',
                 "--model", str(tiny_qwen3_dir))
    assert out.returncode == 0, out.stderr
    assert "on todo (destructive)" in out.stdout and "real result from todo" in out.stdout
    assert '"deleted": "t1"' in out.stdout and "not run" not in out.stdout
    assert json.loads(state.read_text()) == {"t2": TODOS["t2"]}


def test_bad_calls_get_one_line_and_exit_2_before_any_model_loads(todo, tmp_path):
    servers, _, _ = todo
    nothing = tmp_path / "not-a-model"  # loading it would fail with another message
    nothing.mkdir()
    cases = [(["--tool", "delete_todos", "--args", '{"id": "t1"}'],
              "unknown tool 'delete_todos' on the configured servers; did you mean 'delete_todo'"),
             (["--tool", "get_todo", "--args", "[1]"], "--args must be a JSON object, not list"),
             (["--tool", "get_todo", "--args", "{id}"], "--args is not JSON"),
             (["--tool", "get_todo"], "--servers needs --tool NAME and --args JSON"),
             (["--server", "bank", "--tool", "get_todo", "--args", "{}"],
              "--server is for the bundled suites and --servers for your own: give one")]
    for args, message in cases:
        out = envace("policy", "try", "--servers", str(servers), *args, "--model", str(nothing))
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert out.stderr.startswith("error: ") and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


def delete_t2_at_a_terminal(todo, model, typed_ahead: str = "") -> tuple[str, dict, str, int]:
    """`policy try` of `delete_todo(t2)` on a pty: `typed_ahead` typed before anything is shown, `y` typed
    under the question once the screen has been still a second. (The screen and the server's to-dos when
    the question showed, the final screen, the exit code.)"""
    from test_terminal_pty import Terminal  # needs pyte: skipped without it

    servers, state, _ = todo
    term = Terminal([*ENVACE, "policy", "try", "--servers", str(servers), "--tool", "delete_todo",
                     "--args", '{"id": "t2"}', "--model", str(model)], {"HF_HUB_OFFLINE": "1"}, deadline=300)
    try:
        term.type(typed_ahead)
        while term.open and "Run it for real? [y/N]" not in term.text():
            term.settle()
        term.settle(1.0)  # an answer taken from what was typed ahead would have run the call by now
        asked, todos = term.text(), json.loads(state.read_text())
        term.type("y\n")
        code = term.finish()
    finally:
        term.close()
    return asked, todos, term.text(), code


def test_a_person_at_a_terminal_confirms_the_call_after_seeing_its_prediction(todo, tiny_qwen3_dir):
    asked, todos, screen, code = delete_t2_at_a_terminal(todo, tiny_qwen3_dir)
    assert f"rehearsed by {tiny_qwen3_dir}" in asked and "real result" not in asked, asked
    assert todos == TODOS  # asked before anything ran
    assert code == 0, screen
    assert "real result from todo" in screen and '"deleted": "t2"' in screen
    assert json.loads(todo[1].read_text()) == {"t1": TODOS["t1"]}


def test_keys_typed_before_the_question_do_not_answer_it(todo, tiny_qwen3_dir):
    """A `y` typed while the model loads and rehearses (typed ahead, or meant for something else) must not
    run a delete on a server that is not a sandbox: only an answer typed under the question counts."""
    asked, todos, screen, code = delete_t2_at_a_terminal(todo, tiny_qwen3_dir, typed_ahead="y\n")
    assert "real result" not in asked and "not run" not in asked, asked
    assert todos == TODOS
    assert code == 0, screen
    assert "real result from todo" in screen and json.loads(todo[1].read_text()) == {"t1": TODOS["t1"]}
