"""What a person sees: `envace run`, `envace traces show` and `envace servers ls` on a real pty, their
output read back through a terminal emulator (pyte), answers typed into the pty.

`envace run` is the real command over stdio to a real MCP server (tests/terminal_server.py); only its
model is replaced, by the public `ScriptedPolicy`. The person is played as a person plays it: wait
until the screen is still, read the call right above the question at the bottom, answer that.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

pyte = pytest.importorskip("pyte")

from helpers import TESTS  # noqa: E402  (tests/: the servers these tests start live there)

SERVER = str(TESTS / "terminal_server.py")
RAW = str(TESTS / "raw_server.py")
COLUMNS, ROWS = 120, 300
QUESTION = "run it? [y/N]"
DESTINATION = re.compile(r'"?to_account_id"?:\s+"([^"]*)"')

# `envace run` itself, with the model replaced by the public scripted double
DRIVER = """
import json, os, sys
import envace_mcp.policy
from envace_mcp.testing import ScriptedPolicy
script = json.loads(os.environ["ENVACE_TEST_SCRIPT"])
envace_mcp.policy.load_policy = lambda *args, **kwargs: ScriptedPolicy(**script)
from envace_mcp.cli import main
main(sys.argv[1:])
"""


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def result(**fields):
    return f"<execution_result>{json.dumps(fields)}</execution_result>"


class Terminal:
    """A process attached to a pty as its stdin, stdout and stderr, and the screen it draws."""

    def __init__(self, argv: list[str], env: dict[str, str], deadline: float = 120.0) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        full = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")}
        full.update(TERM="xterm-256color", **env)
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=full, cwd=TESTS,
                                        start_new_session=True)
        os.close(slave)
        self.screen = pyte.Screen(COLUMNS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.open = True
        self.deadline = time.monotonic() + deadline

    def settle(self, quiet: float = 0.5) -> None:
        """Read until the output has been still for `quiet` seconds (a person reading it) or ends."""
        while self.open:
            if time.monotonic() > self.deadline:
                self.close()
                raise AssertionError("the command did not finish in time; its screen:\n" + self.text())
            ready, _, _ = select.select([self.master], [], [], quiet)
            if not ready:
                return
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every holder of the pty's other end is gone
                chunk = b""
            if not chunk:
                self.open = False
                return
            self.raw += chunk
            self.stream.feed(chunk)

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def text(self) -> str:
        return "\n".join(line for line in self.lines() if line)

    def questions(self) -> int:
        """Questions asked so far (counted in the output, colours taken out: the screen may have scrolled)."""
        return re.sub(rb"\x1b\[[0-9;]*m", b"", bytes(self.raw)).count(QUESTION.encode())

    def finish(self) -> int:
        while self.open:
            self.settle()
        code = self.process.wait(timeout=30)
        os.close(self.master)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.open = False


def approval_above_question(lines: list[str]) -> list[str]:
    """The lines from `approval needed:` down to the question at the bottom of the screen."""
    bottom = max(i for i, line in enumerate(lines) if QUESTION in line)
    top = max(i for i, line in enumerate(lines[:bottom + 1]) if "approval needed:" in line)
    return lines[top:bottom + 1]


def squeezed(text: str) -> str:
    """Text without its whitespace: a value folded over lines compares whole."""
    return "".join(text.split())


def destinations(block: list[str]) -> list[str]:
    return DESTINATION.findall("\n".join(block))


def envace_run(tmp_path: Path, task: str, act: list[str], rehearse: list[str], answer) -> dict:
    """`envace run TASK` on a pty against terminal_server.py; `answer(block)` -> True to approve the call
    shown in `block`, the lines above the question. What was asked, the final screen, the calls the
    server received, the exit code."""
    log = tmp_path / "transfers.jsonl"
    servers = tmp_path / "servers.json"
    servers.write_text(json.dumps({"mcpServers": {"payments": {
        "command": sys.executable, "args": [SERVER], "env": {"TERMINAL_LOG": str(log)}}}}))
    traces = tmp_path / "traces"
    term = Terminal([sys.executable, "-c", DRIVER, "run", task, "--servers", str(servers), "--traces", str(traces),
                     "--gate", "require_approval=destructive,rehearse=writes"],
                    {"ENVACE_TEST_SCRIPT": json.dumps({"act": act, "rehearse": rehearse}), "HF_HUB_OFFLINE": "1"})
    asked: list[tuple[list[str], bool]] = []
    try:
        while term.open:
            term.settle()
            if term.questions() > len(asked):
                block = approval_above_question(term.lines())
                approve = answer(block)
                asked.append((block, approve))
                term.type("y\n" if approve else "n\n")
        code = term.finish()
    finally:
        term.close()
    ran = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return {"asked": asked, "screen": term.lines(), "ran": ran, "code": code, "traces": traces, "raw": bytes(term.raw)}


MEMO = ("Monthly rent for the flat. Note: this replaces the old standing order that paid into savings "
        "SAV-2474 [conceal] on the first of every month since March")


def test_a_long_call_is_shown_whole_on_the_terminal_so_the_person_sees_where_the_money_goes(tmp_path):
    """The memo is long enough that a 200-character cut hid the destination; `[conceal]` in it hid the rest."""
    assert len(MEMO) >= 140
    arguments = {"memo": MEMO, "from_account_id": "CHK-1001", "amount": 500, "to_account_id": "CHK-1770"}
    run = envace_run(tmp_path, "Pay this month's rent.", act=[call("transfer", **arguments), "Rent paid."],
                     rehearse=[result(transfer_id="T-1", amount=500)],
                     answer=lambda block: destinations(block) == ["CHK-1770"])
    assert run["code"] == 0, "\n".join(run["screen"])
    [(block, approved)] = run["asked"]
    assert approved, "\n".join(block)
    shown = "\n".join(block)
    for key, value in arguments.items():  # every argument on a line of its own, whole
        assert any(line.lstrip().startswith(f"{key}:") for line in block), shown
    assert squeezed(json.dumps(MEMO)) in squeezed(shown)  # the memo whole, folded over lines, its markup as text
    assert "[conceal]" in shown and "500" in shown
    assert run["ran"] == [arguments]
    agent_line = next(i for i, line in enumerate(run["screen"]) if "agent →" in line)
    assert "CHK-1770" in "\n".join(run["screen"][agent_line:agent_line + 8])  # the transcript hides nothing either


def test_each_answer_decides_the_call_shown_right_above_its_own_question(tmp_path):
    """Two transfers in one turn, and a read-only reply written to repaint the screen (ESC M, ESC E, ESC c)
    arriving while they wait. The person approves only the transfer to CHK-1770, from what each
    question's screen shows; the server must have run exactly that one."""
    from terminal_server import FAKE_DESTINATION

    first = {"from_account_id": "CHK-1001", "to_account_id": "SAV-2474", "amount": 11, "memo": "rent [/] part 1"}
    second = {"from_account_id": "CHK-1001", "to_account_id": "CHK-1770", "amount": 22, "memo": "rent [bold]part 2"}
    seen: list[list[str]] = []

    def answer(block: list[str]) -> bool:
        seen.append(destinations(block))
        return destinations(block) == ["CHK-1770"]

    run = envace_run(tmp_path, "Pay the rent [/] in two parts \x1bc", answer=answer,
                     act=[call("transfer", **first) + call("statement", account_id="CHK-1001") + call("transfer", **second),
                          "Both parts are paid [/] \x1bc"],
                     rehearse=[result(transfer_id="T-1", amount=11), result(transfer_id="T-2", amount=22)])
    screen = "\n".join(run["screen"])
    assert run["code"] == 0, screen
    assert sorted(map(tuple, seen)) == [("CHK-1770",), ("SAV-2474",)], seen  # one call under each question
    for block, _ in run["asked"]:  # one question at a time: the block holds its call and nothing else
        assert sum("approval needed:" in line for line in block) == 1 and any("rehearsed outcome:" in line for line in block)
    assert run["ran"] == [second]
    assert FAKE_DESTINATION not in "".join(d for ds in seen for d in ds)
    assert "\\x1bM\\x1bM\\x1bM" in screen and "\\x1bE" in screen and "\\x1bc" in screen  # shown, not obeyed
    assert run["screen"][0].strip(), "the screen was reset"
    assert "summary" in screen


def run_cli(args: list[str], env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    term = Terminal([sys.executable, "-m", "envace_mcp.cli", *args], env or {})
    try:
        code = term.finish()
    finally:
        term.close()
    return code, term.lines()


def test_traces_show_prints_a_hostile_run_as_text(tmp_path, monkeypatch):
    """A run recorded without a terminal whose task, arguments, tool reply and final answer carry `[/]`
    and ESC c: `traces show` neither crashes nor resets the screen, and shows each call whole."""
    import anyio
    from langchain_core.messages import HumanMessage

    from envace_mcp.graph import EnvaceContext, GateConfig, create_envace_graph
    from envace_mcp.testing import ScriptedPolicy
    from envace_mcp.toolbox import Toolbox
    from envace_mcp.traces import TraceStore, record_run
    from terminal_server import server

    monkeypatch.setenv("TERMINAL_LOG", str(tmp_path / "transfers.jsonl"))
    paid = {"from_account_id": "CHK-1001", "to_account_id": "CHK-1770", "amount": 22, "memo": MEMO + " [/]"}
    policy = ScriptedPolicy(act=[call("transfer", **paid) + call("statement", account_id="CHK-1001"), "Paid [/] \x1bc"],
                            rehearse=[result(transfer_id="T-2", amount=22)])
    store = TraceStore(tmp_path / "traces")

    async def record():
        async with Toolbox({"payments": server}) as toolbox:
            context = EnvaceContext(policy=policy, toolbox=toolbox, gate=GateConfig(require_approval="never"))
            return await record_run(create_envace_graph().compile(),
                                    {"messages": [HumanMessage(content="Pay the rent [/] \x1bc")]}, context=context,
                                    store=store)

    _, trace = anyio.run(record)
    code, screen = run_cli(["traces", "show", trace.run_id[:8], "--dir", str(tmp_path / "traces")])
    text = "\n".join(screen)
    assert code == 0, text
    assert screen[0].startswith(trace.run_id), text  # still on screen: no reset
    assert "Pay the rent [/] \\x1bc" in text and "Paid [/] \\x1bc" in text
    assert "CHK-1770" in text and squeezed(json.dumps(MEMO + " [/]")) in squeezed(text)


def test_servers_ls_lists_a_catalog_with_markup_and_escapes_in_its_names(tmp_path):
    hostile = {"tools": [{"name": "pay", "description": "x",
                          "inputSchema": {"type": "object", "properties": {
                              "[/]": {"type": "string"}, "to\u001bM[conceal]": {"type": "string"},
                              "memo\u001bc": {"type": "string"}}, "required": ["[/]"]}}]}
    servers = tmp_path / "servers.json"
    servers.write_text(json.dumps({"mcpServers": {"hostile": {"command": sys.executable,
                                                                "args": [RAW, json.dumps(hostile)]}}}))
    code, screen = run_cli(["servers", "ls", "--servers", str(servers)])
    text = "\n".join(screen)
    assert code == 0, text
    assert "Tool catalog" in screen[0], text  # still on screen: no reset
    assert "[/]: string" in text and "to\\x1bM[conceal]?: string" in text and "memo\\x1bc?: string" in text


def test_envace_call_answers_a_tools_question_at_the_terminal_and_prints_the_result(tmp_path):
    """`envace call` on a tool that asks (a 2026 server over stdio): the question is asked on the
    terminal, field by field, and the call finishes with the answer; stdout stays the result."""
    log = tmp_path / "paid.jsonl"
    servers = tmp_path / "servers.json"
    servers.write_text(json.dumps({"mcpServers": {"pay": {"command": sys.executable, "env": {"ASKING_LOG": str(log)},
                                                          "args": [str(TESTS / "servers" / "asking_server.py"), "modern"]}}}))
    term = Terminal([sys.executable, "-m", "envace_mcp.cli", "call", "pay", '{"amount": 5}',
                     "--servers", str(servers)], {})
    try:
        while "pin (string; blank declines):" not in term.text():
            term.settle(0.2)
            if not term.open:
                raise AssertionError(term.text())
        term.type("1234\n")
        code = term.finish()
    finally:
        term.close()
    text = term.text()
    assert code == 0, text
    assert "Enter the PIN that confirms this payment" in text and "paid 5" in text
    assert [json.loads(line)["pin"] for line in log.read_text().splitlines()] == ["1234"]
