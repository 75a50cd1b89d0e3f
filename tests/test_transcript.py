"""The CLI's terminal approver: asks on a real terminal (a pty), denies when stdin is none."""

OK = {"status": "result", "result": {"balance": 5}}


def test_the_terminal_approver_asks_on_a_terminal_and_denies_without_one():
    import io
    import os

    import anyio
    from rich.console import Console

    from envace_mcp._transcript import TerminalApprover

    request = {"type": "tool_approval", "tool_call_id": "c1", "name": "transfer", "args": {"amount": 9},
               "description": "transfer(...)", "rehearsal": OK, "reason": "approval required"}
    shown = io.StringIO()
    console = Console(file=shown, width=200)
    master, slave = os.openpty()  # a real terminal on stdin
    with os.fdopen(slave, "r") as tty:
        os.write(master, b"y\nno\n")
        assert anyio.run(TerminalApprover(console, stdin=tty), request) is True
        assert anyio.run(TerminalApprover(console, stdin=tty), request) is False
    os.close(master)
    assert "approval needed: transfer" in shown.getvalue() and "run it? [y/N]" in shown.getvalue()
    assert "predicts {\"balance\": 5}" in shown.getvalue()
    with open(os.devnull) as not_a_terminal:
        assert anyio.run(TerminalApprover(console, stdin=not_a_terminal), request) is False
        assert anyio.run(TerminalApprover(console, stdin=not_a_terminal, assume_yes=True), request) is True
    assert "denied: no terminal on stdin" in shown.getvalue() and "approved (--yes)" in shown.getvalue()
