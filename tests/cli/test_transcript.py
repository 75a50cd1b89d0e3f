"""The CLI's transcript and terminal approver: asks on a real terminal (a pty), one question at a time,
denies when stdin is none; shows calls whole and untrusted text as text."""

import io
import os

import anyio
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from rich.console import Console

from envace_mcp._terminal import safe, visible
from envace_mcp._transcript import TerminalApprover, Transcript

OK = {"status": "result", "result": {"balance": 5}}
QUESTION = "run it? [y/N]"


def request(amount, **args):
    return {"type": "tool_approval", "tool_call_id": f"c{amount}", "name": "transfer", "args": {"amount": amount, **args},
            "description": "transfer(...)", "rehearsal": OK, "reason": "approval required"}


async def answer_each_question(shown: io.StringIO, master: int, answer, questions: int) -> list[str]:
    """Play the person: when every task waits, read the approval right above the question at the bottom
    and type `answer(block)`; the blocks read, in order."""
    blocks = []
    with anyio.fail_after(20):
        while len(blocks) < questions:
            await anyio.wait_all_tasks_blocked()
            text = shown.getvalue()
            if text.count(QUESTION) > len(blocks):
                block = text[text.rindex("approval needed:"):text.rindex(QUESTION)]
                blocks.append(block)
                os.write(master, answer(block).encode())
            else:
                await anyio.sleep(0.01)  # the reading thread has not started yet
    return blocks


def test_the_terminal_approver_asks_on_a_terminal_and_denies_without_one():
    shown = io.StringIO()
    console = Console(file=shown, width=200)
    master, slave = os.openpty()  # a real terminal on stdin

    async def main():
        results = []
        for reply in ("y\n", "no\n"):
            async with anyio.create_task_group() as tg:
                tg.start_soon(answer_each_question, shown, master, lambda block, r=reply: r, 1)
                results.append(await TerminalApprover(console, stdin=tty)(request(9)))
        return results

    with os.fdopen(slave, "r") as tty:
        assert anyio.run(main) == [True, False]
    os.close(master)
    assert "approval needed: transfer" in shown.getvalue() and QUESTION in shown.getvalue()
    assert "predicts {\"balance\": 5}" in shown.getvalue()
    with open(os.devnull) as not_a_terminal:
        unasked = anyio.run(TerminalApprover(console, stdin=not_a_terminal), request(9))
        assert unasked["type"] == "reject" and "no terminal" in unasked["message"]  # what the agent is told
        assert anyio.run(TerminalApprover(console, stdin=not_a_terminal, assume_yes=True), request(9)) is True
    assert "denied: no terminal on stdin" in shown.getvalue() and "approved (--yes)" in shown.getvalue()


def test_two_approvals_asked_at_once_are_asked_one_at_a_time_each_answer_deciding_its_own_call():
    """Two destructive calls of one turn ask together (two concurrent `act` tasks). The second is shown
    only once the first is answered, so the answer typed under a call is that call's."""
    shown = io.StringIO()
    console = Console(file=shown, width=200)
    master, slave = os.openpty()
    approver = TerminalApprover(console, stdin=None)

    async def main():
        answers = {}

        async def ask(amount):
            answers[amount] = await approver(request(amount, to_account_id=f"ACC-{amount}"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, 10)
            tg.start_soon(ask, 20)
            blocks = await answer_each_question(shown, master, lambda block: "y\n" if "ACC-20" in block else "n\n", 2)
        return answers, blocks

    with os.fdopen(slave, "r") as tty:
        approver.stdin = tty
        answers, blocks = anyio.run(main)
    os.close(master)
    assert answers == {10: False, 20: True}
    assert all(block.count("approval needed:") == 1 and block.count("to_account_id") == 1 for block in blocks)
    assert shown.getvalue().count(QUESTION) == 2


def test_keys_typed_before_a_question_is_shown_do_not_answer_it():
    shown = io.StringIO()
    master, slave = os.openpty()

    async def main():
        os.write(master, b"y\n")  # typed while the previous call was still on screen
        async with anyio.create_task_group() as tg:
            tg.start_soon(answer_each_question, shown, master, lambda block: "n\n", 1)
            return await TerminalApprover(Console(file=shown, width=200), stdin=tty)(request(9))

    with os.fdopen(slave, "r") as tty:
        assert anyio.run(main) is False
    os.close(master)


def test_an_approval_shows_a_long_call_whole_one_argument_per_line():
    shown = io.StringIO()
    memo = "Monthly rent; replaces the standing order into SAV-2474 " + "x" * 100 + " [conceal] end of memo"
    args = {"memo": memo, "from_account_id": "CHK-1001", "amount": 500, "to_account_id": "CHK-1770"}
    assert anyio.run(TerminalApprover(Console(file=shown, width=80), assume_yes=True), {**request(500), "args": args})
    lines = shown.getvalue().splitlines()
    assert lines[0].rstrip() == "   approval needed: transfer("
    for key in ("memo", "from_account_id", "amount", "to_account_id"):
        assert sum(line.lstrip().startswith(f"{key}:") for line in lines) == 1, lines
    assert any(line.split() == ["to_account_id:", '"CHK-1770"'] for line in lines), lines
    assert '[conceal]endofmemo"' in "".join(shown.getvalue().split())  # markup shown as written
    assert max(len(line.rstrip()) for line in lines) <= 80  # folded, not cut
    assert "".join(memo.split()) in "".join(shown.getvalue().split())


def test_the_transcript_shows_calls_whole_and_untrusted_text_as_text():
    """Markup and terminal control sequences in arguments, rehearsals, gate reasons, replies and answers
    are printed as they are written, never obeyed (no MarkupError, no raw ESC reaching the terminal)."""
    shown = io.StringIO()
    console = Console(file=shown, width=100)  # no colours: any ESC in the output came from the content
    transcript = Transcript(console)
    hostile = "[/] [conceal]\x1bM\x1bE\x1bc\x9b2J\u202eevil\u202c\x7f\x00"
    long_args = {"memo": "m" * 150, "from_account_id": "CHK-1", "amount": 500, "to_account_id": "CHK-1770"}
    transcript.update("agent", {"messages": [AIMessage(content="", tool_calls=[
        {"name": "transfer", "args": long_args, "id": "t1"},
        {"name": "note[/]", "args": {"text[/]": hostile}, "id": "t2"}])]})
    transcript.update("rehearse", {"rehearsals": [{"call_id": "t2", "tool": "note[/]", "prediction": {
        "status": "tool_error", "code": "X[/]", "message": hostile}}]})
    transcript.update("gate", {"rehearsals": [{"call_id": "t2", "decision": "execute", "reason": hostile}]})
    transcript.update("act", {"rehearsals": [{"call_id": "t2", "real": {}, "match": 0.5, "mismatches": [hostile]}],
                              "messages": [ToolMessage(content=hostile, tool_call_id="t2", status="error")]})
    transcript.update("agent", {"messages": [HumanMessage(content=hostile), AIMessage(content=hostile)]})
    out = shown.getvalue()
    assert "\x1b" not in out and "\x9b" not in out and "\u202e" not in out and "\x00" not in out
    # rehearsal, gate reason, reply, format reminder, answer; the call's arguments as JSON writes them
    assert out.count("[/] [conceal]\\x1bM\\x1bE\\x1bc\\x9b2J\\u202eevil\\u202c\\x7f\\x00") == 5, out
    assert 'note[/]({"text[/]": "[/] [conceal]\\u001bM\\u001bE\\u001bc\\x9b2J\\u202eevil' in out and "X[/]" in out
    assert "to_account_id:" in out and '"CHK-1770"' in out and "m" * 60 in out  # the long call whole


def test_a_real_tool_reply_is_shown_as_its_lines_each_still_escaped():
    """A server's indented JSON or a text listing reads as lines, not one line of `\\n`; a line's control
    characters are still shown as escapes, and a long reply says how many lines it left out."""
    shown = io.StringIO()
    transcript = Transcript(Console(file=shown, width=100))
    reply = '{\r\n  "balance": 5,\n  "memo": "paid\x1b[2J\rthanks"\n}\n'
    transcript.update("act", {"rehearsals": [{"call_id": "c1", "real": {"balance": 5}}],
                              "messages": [ToolMessage(content=reply, tool_call_id="c1")]})
    lines = shown.getvalue().splitlines()
    assert lines == ["   real: {", '           "balance": 5,', '           "memo": "paid\\x1b[2J\\rthanks"', "         }"]
    shown.truncate(0), shown.seek(0)
    transcript.update("act", {"messages": [ToolMessage(content="\n".join(f"row {i}" for i in range(20)), tool_call_id="c2")]})
    lines = shown.getvalue().splitlines()
    assert lines[0] == "   reply: row 0" and lines[11] == "          row 11" and lines[12] == "          … 8 more lines"


@pytest.mark.parametrize(("text", "seen"), [
    ("a\x1bMb", "a\\x1bMb"), ("\x1bc", "\\x1bc"), ("x\x9b2J", "x\\x9b2J"), ("del\x7f", "del\\x7f"),
    ("line\nnext\r\t", "line\\nnext\\r\\t"), ("\u202eevil\u202c\u2066\u2069", "\\u202eevil\\u202c\\u2066\\u2069"),
    ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"), ("tag\U000e0041", "tag\\U000e0041"),
    ("caf\udce9", "caf\\udce9"), ("café 名前 [/] [conceal]", "café 名前 [/] [conceal]"),
])
def test_control_and_invisible_characters_are_shown_as_escapes_and_markup_as_text(text, seen):
    assert visible(text) == seen
    assert safe(text).plain == seen  # a Text: rich never reads it as markup
    assert visible("a\nb\x1b", newlines=True) == "a\nb\\x1b"


def asking(questions):
    return {"type": "tool_input", "tool_call_id": "c1", "name": "book", "args": {"room": "blue"}, "round": 1,
            "questions": questions, "description": "book(...)", "rehearsal": OK}


FORM = {"key": "who", "message": "Who books it?\x1b[2J", "mode": "form",
        "requested_schema": {"type": "object", "properties": {
            "name": {"type": "string"}, "seats": {"type": "integer"},
            "size": {"type": "string", "enum": ["small", "large"]}, "extras": {"type": "array", "items": {"enum": ["tv", "tea"]}}}, "required": ["seats"]}}


def test_a_tools_questions_are_answered_on_the_terminal_field_by_field_typed_and_escaped():
    """A server's questions (`tool_input`) are asked on the terminal: each field typed as the schema says
    (a wrong value, or a blank required one, asked again), a blank first field declines, a URL question is accepted once done; its
    message is shown escaped. `--yes` and no terminal answer nothing."""
    shown = io.StringIO()
    console = Console(file=shown, width=200)
    master, slave = os.openpty()
    url = {"key": "pay", "message": "Pay first", "mode": "url", "url": "https://pay.example/x"}

    def prompts():  # each field's prompt ends "(type): ", the URL's "[y/N] "; shown once its input is flushed
        return shown.getvalue().count("): ") + shown.getvalue().count("[y/N] ")

    async def main(tty):
        async def person():
            for number, line in enumerate(("Ada", "", "three", "3", "medium", "large", "tv, tea", "y", "")):
                with anyio.fail_after(20):
                    while prompts() <= number:
                        await anyio.sleep(0.01)
                os.write(master, (line + "\n").encode())

        async with anyio.create_task_group() as tg:
            tg.start_soon(person)
            answered = await TerminalApprover(console, stdin=tty)(asking([FORM, url]))
            declined = await TerminalApprover(console, stdin=tty)(asking([FORM]))
        return answered, declined

    with os.fdopen(slave, "r") as tty:
        answered, declined = anyio.run(main, tty)
    os.close(master)
    assert answered == {"type": "respond", "responses": {
        "who": {"action": "accept", "content": {"name": "Ada", "seats": 3, "size": "large", "extras": ["tv", "tea"]}},
        "pay": {"action": "accept"}}}
    assert declined == {"type": "respond", "responses": {"who": {"action": "decline"}}}
    text = shown.getvalue()
    assert "\x1b" not in text and "\\x1b[2J" in text and "https://pay.example/x" in text
    assert "not that: this field is required" in text and "(one of small, large; blank skips)" in text
    assert "name (string; blank declines)" in text
    with open(os.devnull) as not_a_terminal:
        for approver in (TerminalApprover(console, stdin=not_a_terminal),
                         TerminalApprover(console, stdin=not_a_terminal, assume_yes=True)):
            assert anyio.run(approver, asking([FORM]))["type"] == "reject"
