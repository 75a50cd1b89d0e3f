"""A readable, streamed transcript of a graph run for the CLI (rich).

Everything a model, a server or a task wrote is printed through `envace_mcp._terminal` (as text, its
control characters visible); calls are shown whole."""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from rich.console import Console, RenderableType
from rich.text import Text

from envace_mcp._terminal import call_display, call_lines, discard_typed_ahead, safe, visible
from envace_mcp.graph.memory import shorten, summarize

_DECISION_STYLE = {"execute": "green", "simulate": "cyan", "feedback": "yellow", "block": "red", "reject": "red",
                   "budget": "red", "ask": "magenta", "rejected_by_human": "red"}


def _prediction(p: dict[str, Any] | None, limit: int | None = 160) -> Text:
    """A rehearsal in a few words; `limit=None`: whole (an approval shows all it was gated on)."""
    def shown(value: Any) -> Text:
        return safe(value if limit is None else shorten(value, limit))

    if not p:
        return Text("not rehearsed", "dim")
    if p["status"] == "result":
        return Text.assemble(("predicts ", "cyan"), shown(p.get("result")))
    if p["status"] == "tool_error":
        return Text.assemble(("predicts error ", "yellow"), safe(str(p.get("code"))), ": ",
                             shown(p.get("message") or p.get("details") or ""))
    return Text.assemble(("rehearsal unusable (", "dim"), safe(str(p.get("code")), "dim"), (")", "dim"))


REPLY_LINES = 12
"""A tool reply's text lines shown (each cut at 160 characters): enough for an object or a short listing."""


def _reply(content: Any, indent: int) -> Text:
    r"""A tool's reply as the lines it is written in (a server's indented JSON, a text listing), each line
    escaped (`safe`: a lone `\r` or an escape sequence in a line is shown, never obeyed) and indented under
    the first; long replies are cut with a count of the lines left out. Not text: one line of JSON."""
    if not isinstance(content, str):
        return safe(shorten(content))
    lines = re.split(r"\r?\n", content.strip("\r\n"))
    shown = Text("\n" + " " * indent).join(safe(shorten(line)) for line in lines[:REPLY_LINES])
    if len(lines) > REPLY_LINES:
        shown.append(f"\n{' ' * indent}… {len(lines) - REPLY_LINES} more lines", "dim")
    return shown


class Transcript:
    """Prints `updates` stream chunks of the EnvACE graph as they arrive. With the run's
    `TerminalApprover`, a line that arrives while a question waits for its answer is printed after the
    answer: nothing comes between a call shown for approval and the reply typed under it."""

    def __init__(self, console: Console, approver: TerminalApprover | None = None) -> None:
        self.console = console
        self.approver = approver
        self.records: dict[str, dict[str, Any]] = {}

    def print(self, *renderables: RenderableType) -> None:
        if self.approver is not None:
            self.approver.show(*renderables)
        else:
            self.console.print(*renderables)

    def update(self, node: str, update: dict[str, Any] | None) -> None:
        if not update:
            return
        for record in update.get("rehearsals", []) or []:
            known = self.records.setdefault(record["call_id"], {})
            known.update(record)
            self._record(node, known, record)
        for message in update.get("messages", []) or []:
            self._message(node, message)
        if update.get("status") == "max_steps":
            self.print(Text("stopped: step budget spent", "red"))

    def _message(self, node: str, message: Any) -> None:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                self.print(call_display(call["name"], call["args"], self.console.width, Text("agent → ", "bold")))
            if not message.tool_calls:
                self.print(Text.assemble(("agent: ", "bold"), safe(message.content)))
        elif isinstance(message, HumanMessage) and node == "agent":
            self.print(Text.assemble(("format reminder: ", "yellow"), safe(shorten(message.content, 160))))
        elif isinstance(message, ToolMessage) and node == "act":
            record = self.records.get(message.tool_call_id, {})
            colour = "red" if message.status == "error" else "green"
            label = "simulated" if record.get("decision") == "simulate" else "real" if record.get("real") else "reply"
            line = Text.assemble("   ", (f"{label}: ", colour), _reply(message.content, indent=5 + len(label)))
            match = record.get("match")
            if match is not None:
                line.append_text(Text(" (matched)", "green") if match >= 0.999 else Text.assemble(
                    (f" MISMATCH {match:.2f} ", "bold red"), safe(record.get("mismatches", [])[:4])))
            self.print(line)

    def _record(self, node: str, known: dict[str, Any], record: dict[str, Any]) -> None:
        if node == "rehearse":
            self.print(Text.assemble("   rehearse ", safe(str(known.get("tool"))), ": ", _prediction(record.get("prediction"))))
        elif node == "gate":
            style = _DECISION_STYLE.get(record["decision"], "white")
            self.print(Text.assemble("   gate: ", safe(str(record["decision"]), style), " — ", safe(str(record.get("reason") or ""))))


NO_TERMINAL = {"type": "reject", "message": "nobody could be asked: no terminal on stdin (an unattended run)"}


class TerminalApprover:
    """`EnvaceContext.approve` for the CLI: shows the call whole (every argument, one per line) and its
    rehearsed outcome, then asks on the terminal. Questions are asked one at a time, each right under
    the call it is about, with input typed before the question discarded: an answer decides the call
    shown above it. With no terminal on stdin (CI, pipes, `nohup`) the call is denied and the output
    says why; `assume_yes` (`--yes`) approves every call, still shown."""

    def __init__(self, console: Console, *, assume_yes: bool = False, stdin: Any = None) -> None:
        import anyio

        self.console = console
        self.assume_yes = assume_yes
        self.stdin = stdin
        self._one_at_a_time = anyio.Lock()
        self._waiting = False
        self._held: list[tuple[RenderableType, ...]] = []

    def show(self, *renderables: RenderableType) -> None:
        """Print now, or after the answer when a question is waiting for one."""
        if self._waiting:
            self._held.append(renderables)
        else:
            self.console.print(*renderables)

    async def __call__(self, request: dict[str, Any]) -> Any:
        async with self._one_at_a_time:
            return await self._ask(request)

    async def _ask(self, request: dict[str, Any]) -> Any:
        import sys

        if request.get("type") == "tool_input":
            return await self._answer(request)
        self.console.print(call_lines(request["name"], request.get("args", {}), Text("approval needed: ", "magenta"),
                                      indent=3))
        self.console.print(Text.assemble("      rehearsed outcome: ", _prediction(request.get("rehearsal"), None)))
        if self.assume_yes:
            self.console.print(Text.assemble("      ", ("approved", "green"), " (--yes)"))
            return True
        stdin = self.stdin or sys.stdin
        if not (stdin and stdin.isatty()):
            self.console.print(Text.assemble("      ", ("denied:", "red"), " no terminal on stdin to ask (pass --yes, or "
                                             "--gate require_approval=never, to run such calls unasked)"))
            return NO_TERMINAL  # the agent is told nobody could be asked, not that a person said no
        answer = (await self._read(stdin, "      run it? [y/N] ")).lower() in ("y", "yes")
        self.console.print(Text.assemble("      ", ("approved", "green") if answer else ("denied", "red")))
        self._release_held()
        return answer

    async def _answer(self, request: dict[str, Any]) -> Any:
        """A running call's server asks (`tool_input`): each question is shown (escaped) and answered field
        by field on the terminal; a blank first field declines that question. `--yes` answers nothing (it
        approves calls; what to tell a server is the person's to type), and without a terminal the call
        is not continued."""
        import sys

        self.console.print(call_lines(request["name"], request.get("args", {}), Text("the tool asks: ", "magenta"),
                                      indent=3))
        if request.get("problem"):
            self.console.print(Text.assemble("      ", ("asked again: ", "yellow"), safe(str(request["problem"]))))
        stdin = self.stdin or sys.stdin
        if self.assume_yes or not (stdin and stdin.isatty()):
            why = "--yes approves calls, it answers no question" if self.assume_yes else "no terminal on stdin to ask"
            for question in request.get("questions") or []:
                self.console.print(Text.assemble("      ", safe(str(question.get("message")))))
            self.console.print(Text.assemble("      ", ("not answered:", "red"), f" {why}"))
            return {"type": "reject", "message": f"the tool's questions were not answered ({why})"}
        responses = {}
        for question in request.get("questions") or []:
            responses[question["key"]] = await self._one_question(question, stdin)
        self._release_held()
        return {"type": "respond", "responses": responses}

    async def _one_question(self, question: dict[str, Any], stdin: Any) -> dict[str, Any]:
        self.console.print(Text.assemble("      ", safe(str(question.get("message")))))
        if question.get("mode") == "url":
            self.console.print(Text.assemble("      open: ", safe(str(question.get("url")))))
            done = (await self._read(stdin, "      done? [y/N] ")).lower() in ("y", "yes")
            return {"action": "accept"} if done else {"action": "decline"}
        content: dict[str, Any] = {}
        schema = question.get("requested_schema") or {}
        fields, required = schema.get("properties") or {}, set(schema.get("required") or [])
        for position, (name, field) in enumerate(fields.items()):
            for _ in range(3):
                hint = _hint(field, "blank declines" if position == 0 else None if name in required else "blank skips")
                typed = await self._read(stdin, f"      {visible(str(name))}{hint}: ")
                if not typed and position == 0:
                    self.console.print(Text.assemble("      ", ("declined", "red")))
                    return {"action": "decline"}
                try:
                    if typed:
                        content[str(name)] = _typed(typed, field)
                    elif name in required:
                        raise ValueError("this field is required")
                    break
                except ValueError as exc:
                    self.console.print(Text.assemble("      ", ("not that: ", "yellow"), safe(str(exc))))
            else:
                return {"action": "decline"}
        return {"action": "accept", "content": content}

    async def _read(self, stdin: Any, prompt: str) -> str:
        """One line typed after `prompt` (what was typed before it is discarded), read off the loop so other
        runs go on; what they print meanwhile is held (`show`)."""
        import anyio

        discard_typed_ahead(stdin)
        self.console.print(Text(prompt), end="")
        self._waiting = True
        try:
            return (await anyio.to_thread.run_sync(stdin.readline)).strip()
        finally:
            self._waiting = False

    def _release_held(self) -> None:
        """Print what was held while a question waited, once it is answered."""
        held, self._held = self._held, []
        for renderables in held:
            self.console.print(*renderables)


def _hint(field: Any, blank: str | None = None) -> str:
    """` (integer)`, ` (one of a, b; blank skips)`: what a form field takes, from the server's (untrusted)
    schema, and what a blank line does."""
    if not isinstance(field, dict):
        return f" ({blank})" if blank else ""
    items = field.get("items") if isinstance(field.get("items"), dict) else {}
    choices = field.get("enum") or items.get("enum")
    kind = str(field.get("type", ""))
    text = f"one of {', '.join(map(str, choices))}" if isinstance(choices, list) and choices else kind
    if kind == "array":
        text += ", comma-separated"
    text = "; ".join(filter(None, [visible(text[:200]), blank]))
    return f" ({text})" if text else ""


def _typed(text: str, field: Any) -> Any:
    """`text` as the value the field's type wants; `ValueError` saying what it wants otherwise."""
    kind = field.get("type") if isinstance(field, dict) else "string"
    if kind == "integer":
        return int(text)
    if kind == "number":
        return float(text)
    if kind == "boolean":
        if text.lower() in ("y", "yes", "true"):
            return True
        if text.lower() in ("n", "no", "false"):
            return False
        raise ValueError("yes or no")
    if kind == "array":
        values = [part.strip() for part in text.split(",") if part.strip()]
        allowed = (field.get("items") or {}).get("enum") if isinstance(field.get("items"), dict) else None
        if isinstance(allowed, list) and any(v not in allowed for v in values):
            raise ValueError(f"choose from {', '.join(map(str, allowed))}")
        return values
    allowed = field.get("enum") if isinstance(field, dict) else None
    if isinstance(allowed, list) and text not in allowed:
        raise ValueError(f"one of {', '.join(map(str, allowed))}")
    return text


def print_summary(console: Console, records: list[dict[str, Any]], score: float | None = None) -> None:
    """The closing lines of `envace demo` / `envace run`: what happened to every proposed call."""
    s = summarize(records)
    stopped = sum(s["stopped"].values())
    by_reason = ", ".join(f"{n} {kind}" for kind, n in sorted(s["stopped"].items()))
    console.print("\n[bold]summary[/]")
    console.print(f"  calls proposed {s['proposed']}, rehearsed {s['rehearsed']}, predicted to fail {s['predicted_to_fail']}")
    console.print(f"  stopped by the gate {stopped}" + (f" ({by_reason})" if by_reason else "")
                  + f"; approvals: {s['approved']} approved, {s['denied']} denied")
    console.print(f"  executed on the real server {s['executed']}" + (f", simulated {s['simulated']}" if s["simulated"] else "")
                  + f"; rehearsal matched reality {s['matched']} of {s['compared']}")
    if score is not None:
        console.print(f"  [bold]checker score: {score:.2f}[/]")
