"""A readable, streamed transcript of a graph run for the CLI (rich)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from rich.console import Console

from envace_mcp.graph.memory import shorten

_DECISION_STYLE = {"execute": "green", "simulate": "cyan", "feedback": "yellow", "block": "red", "reject": "red",
                   "budget": "red", "ask": "magenta", "rejected_by_human": "red"}


def _prediction(p: dict[str, Any] | None) -> str:
    if not p:
        return "[dim]not rehearsed[/]"
    if p["status"] == "result":
        return f"[cyan]predicts[/] {shorten(p.get('result'))}"
    if p["status"] == "tool_error":
        return f"[yellow]predicts error[/] {p.get('code')}: {shorten(p.get('message') or p.get('details') or '', 160)}"
    return f"[dim]rehearsal unusable ({p.get('code')})[/]"


class Transcript:
    """Prints `updates` stream chunks of the EnvACE graph as they arrive."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.records: dict[str, dict[str, Any]] = {}

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
            self.console.print("[red]stopped: step budget spent[/]")

    def _message(self, node: str, message: Any) -> None:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                self.console.print(f"[bold]agent →[/] {call['name']}({shorten(call['args'], 200)})")
            if not message.tool_calls:
                self.console.print(f"[bold]agent:[/] {message.content}")
        elif isinstance(message, HumanMessage) and node == "agent":
            self.console.print(f"[yellow]format reminder:[/] {shorten(message.content, 160)}")
        elif isinstance(message, ToolMessage) and node == "act":
            record = self.records.get(message.tool_call_id, {})
            colour = "red" if message.status == "error" else "green"
            label = "simulated" if record.get("decision") == "simulate" else "real" if record.get("real") else "reply"
            line = f"   [{colour}]{label}:[/] {shorten(message.content)}"
            match = record.get("match")
            if match is not None:
                line += " [green](matched)[/]" if match >= 0.999 else f" [bold red]MISMATCH {match:.2f}[/] {record.get('mismatches', [])[:4]}"
            self.console.print(line)

    def _record(self, node: str, known: dict[str, Any], record: dict[str, Any]) -> None:
        if node == "rehearse":
            self.console.print(f"   rehearse {known.get('tool')}: {_prediction(record.get('prediction'))}")
        elif node == "gate":
            style = _DECISION_STYLE.get(record["decision"], "white")
            self.console.print(f"   gate: [{style}]{record['decision']}[/] — {record.get('reason', '')}")


class TerminalApprover:
    """`EnvaceContext.approve` for the CLI: shows the call and its rehearsed outcome, then asks on the
    terminal. With no terminal on stdin (CI, pipes, `nohup`) the call is denied and the output says why;
    `assume_yes` (`--yes`) approves every call, still shown."""

    def __init__(self, console: Console, *, assume_yes: bool = False, stdin: Any = None) -> None:
        self.console = console
        self.assume_yes = assume_yes
        self.stdin = stdin

    async def __call__(self, request: dict[str, Any]) -> bool:
        import sys

        import anyio

        self.console.print(f"   [magenta]approval needed:[/] {request['name']}({shorten(request.get('args', {}), 200)})")
        self.console.print(f"      rehearsed outcome: {_prediction(request.get('rehearsal'))}")
        if self.assume_yes:
            self.console.print("      [green]approved[/] (--yes)")
            return True
        stdin = self.stdin or sys.stdin
        if not (stdin and stdin.isatty()):
            self.console.print("      [red]denied:[/] no terminal on stdin to ask (pass --yes, or "
                               "--gate require_approval=never, to run such calls unasked)")
            return False
        self.console.print("      run it? [y/N] ", end="", markup=False)
        reply = await anyio.to_thread.run_sync(stdin.readline)  # off the loop: other runs go on
        answer = reply.strip().lower() in ("y", "yes")
        self.console.print("      [green]approved[/]" if answer else "      [red]denied[/]")
        return answer


def print_summary(console: Console, records: list[dict[str, Any]], score: float | None = None) -> None:
    """The closing lines of `envace demo` / `envace run`: what happened to every proposed call."""
    from envace_mcp.graph.memory import summarize

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
