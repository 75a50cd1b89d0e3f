"""Rendering rehearsal memory into the act role's prompt.

The act role sees, in a last message after the conversation under "# Rehearsal memory":
- notes brought in from outside the run (test-time rehearsal: what imagined attempts did, their
  critiques' pitfalls and advice);
- for the most recent proposed calls, one line each: the call, what the rehearsal predicted, what
  the gate did and why, and — when the call really ran — whether reality matched (mismatches are
  flagged `MISMATCH`, so the agent learns to distrust that kind of prediction);
- a closing line with the counts of mismatches and of calls stopped by the gate.

Lines are compact (values cut at 160 characters) and only the last `limit` records are shown, so
the prompt stays bounded however long the run.
"""

from __future__ import annotations

import json
from typing import Any

from envace_mcp.graph.state import RehearsalRecord
from envace_mcp.traces.schema import STOPPED


def shorten(value: Any, limit: int = 160) -> str:
    """One line of JSON-ish text, cut with an ellipsis."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _predicted(prediction: dict[str, Any] | None) -> str:
    if not prediction:
        return "not rehearsed"
    status = prediction.get("status")
    if status == "result":
        return f"predicted {shorten(prediction.get('result'))}"
    if status == "tool_error":
        detail = prediction.get("message") or prediction.get("details") or ""
        return f"predicted error {prediction.get('code')}: {shorten(detail, 100)}"
    return f"rehearsal unusable ({prediction.get('code')})"


def render_line(record: RehearsalRecord) -> str:
    call = f"{record.get('tool')}({shorten(record.get('arguments', {}), 120)})"
    parts = [f"- {call}: {_predicted(record.get('prediction'))}"]
    decision = record.get("decision")
    if decision:
        parts.append(f"gate: {decision} ({shorten(record.get('reason', ''), 100)})")
    real = record.get("real")
    if real is not None:
        outcome = "error" if real.get("is_error") else "ok"
        text = real.get("structured_content") if real.get("structured_content") is not None else real.get("content")
        parts.append(f"real {outcome}: {shorten(text, 120)}")
        match = record.get("match")
        if match is not None:
            parts.append("matched" if match >= 0.999 else f"MISMATCH (fidelity {match:.2f})")
    return "; ".join(parts)


def render_memory(records: list[RehearsalRecord], notes: str | None = None, *, limit: int = 8) -> str | None:
    """The "# Rehearsal memory" text for the act prompt, or `None` when there is nothing to say."""
    sections: list[str] = []
    if notes and notes.strip():
        sections.append(notes.strip())
    shown = [r for r in records if r.get("prediction") is not None or r.get("decision") in STOPPED]
    if shown:
        sections.append("Calls so far:\n" + "\n".join(render_line(r) for r in shown[-limit:]))
        mismatches = sum(1 for r in records if r.get("match") is not None and r["match"] < 0.999)
        stopped = sum(1 for r in records if r.get("decision") in STOPPED)
        sections.append(f"{mismatches} prediction(s) differed from reality; {stopped} call(s) were stopped by the gate.")
    return "\n\n".join(sections) if sections else None


def summarize(records: list[RehearsalRecord]) -> dict[str, Any]:
    """What happened to a run's proposed calls, counted from its rehearsal memory (the CLI's summary).

    `stopped` counts calls the gate did not run, by its decision (`reject`, `feedback`, `block`,
    `budget`); a human's "no" is counted in `denied`, not there. `matched` of `compared`: executed
    calls whose rehearsal matched the real result."""
    stopped: dict[str, int] = {}
    for record in records:
        decision = record.get("decision")
        if decision in STOPPED and decision != "rejected_by_human":
            stopped[decision] = stopped.get(decision, 0) + 1
    predictions = [r.get("prediction") for r in records]
    compared = [r["match"] for r in records if r.get("match") is not None]
    return {
        "proposed": len(records),
        "rehearsed": sum(p is not None for p in predictions),
        "predicted_to_fail": sum(1 for p in predictions if p and p.get("status") == "tool_error"),
        "stopped": stopped,
        "approved": sum(1 for r in records if r.get("approved") is True),
        "denied": sum(1 for r in records if r.get("approved") is False),
        "executed": sum(1 for r in records if r.get("real") is not None),
        "simulated": sum(1 for r in records if r.get("decision") == "simulate"),
        "compared": len(compared),
        "matched": sum(1 for m in compared if m >= 0.999),
    }
