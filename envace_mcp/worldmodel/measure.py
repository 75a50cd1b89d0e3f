"""How well a world model predicts a server's replies, tool by tool, and the trust it earns.

For each real call (`calls.Observed`) the rehearse role predicts the reply greedily, as runs rehearse,
and scores the real reply teacher-forced. Per tool and overall:

- `status_accuracy`: the predicted status (error or result) is the real one; an unusable rehearsal is wrong;
- `failure_precision` / `failure_recall`: predicted failures that were real failures / real failures
  that were predicted (None where there was nothing to divide by);
- `success_precision`: predicted results that were real results (what may stand in for approval);
- `field_accuracy`: leaf fields of successful replies right, by kind: `echoed` from the call's
  arguments, `read` earlier in the run, `computed` by the server (`fidelity.field_split`);
- `nll_per_token`: the real reply's negative log-likelihood per token under the rehearse prompt (one
  forward pass; ECHO's environment-token metric), pooled over calls;
- `unusable`: the share of rehearsals that could not be read.

`trust_table` turns a tool's figures into `ToolTrust` by the bars below, stated in what it writes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envace_mcp.policy.fidelity import field_split
from envace_mcp.worldmodel.calls import Observed

MIN_STOPS = 3
"""Predicted failures a tool needs on held-out calls before they may stop its calls."""
STOP_PRECISION = 0.8
"""…of which at least this share must have been real failures."""
MIN_SUCCESSES = 10
"""Predicted successes a tool needs before they may stand in for approval (`require_approval=measured`)."""
SKIP_PRECISION = 0.95
"""…of which at least this share must have been real successes, with `status_accuracy` at least as high
as `SKIP_STATUS`."""
SKIP_STATUS = 0.9
KINDS = {"echoed": "echoed", "read": "seen", "computed": "new"}
"""Report names of `fidelity.field_split`'s kinds."""


@dataclass
class Scored:
    """One call's prediction against reality."""

    tool: str
    failed: bool
    predicted: str  # "result" | "tool_error" | "invalid"
    episode: str = ""
    index: int = 0
    fields: dict[str, int] = field(default_factory=dict)
    nll: float = 0.0
    tokens: int = 0
    text: str = ""


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def summarise(scored: list[Scored]) -> dict[str, Any]:
    """The figures of the module's list over `scored` calls."""
    n = len(scored)
    failed = sum(s.failed for s in scored)
    said_fail = [s for s in scored if s.predicted == "tool_error"]
    said_ok = [s for s in scored if s.predicted == "result"]
    right = sum((s.predicted == "tool_error") == s.failed and s.predicted != "invalid" for s in scored)
    fields = {name: [0, 0] for name in KINDS}
    for s in scored:
        for name, kind in KINDS.items():
            fields[name][0] += s.fields.get(f"{kind}_ok", 0)
            fields[name][1] += s.fields.get(kind, 0)
    tokens = sum(s.tokens for s in scored)
    return {
        "calls": n, "failures": failed,
        "status_accuracy": _ratio(right, n),
        "failure_precision": _ratio(sum(s.failed for s in said_fail), len(said_fail)),
        "failure_recall": _ratio(sum(s.failed for s in said_fail), failed),
        "success_precision": _ratio(sum(not s.failed for s in said_ok), len(said_ok)),
        "predicted_failures": len(said_fail), "predicted_successes": len(said_ok),
        "unusable": _ratio(sum(s.predicted == "invalid" for s in scored), n),
        "field_accuracy": {name: _ratio(ok, total) for name, (ok, total) in fields.items()},
        "fields": {name: total for name, (_, total) in fields.items()},
        "nll_per_token": sum(s.nll for s in scored) / tokens if tokens else None,
    }


def trust_entry(figures: dict[str, Any]) -> dict[str, Any]:
    """`ToolTrust` fields for one tool's held-out figures, with why, by the module's bars."""
    stops, precision = figures["predicted_failures"], figures["failure_precision"]
    stop = stops >= MIN_STOPS and precision is not None and precision >= STOP_PRECISION
    oks, ok_precision, status = figures["predicted_successes"], figures["success_precision"], figures["status_accuracy"]
    skip = (oks >= MIN_SUCCESSES and ok_precision is not None and ok_precision >= SKIP_PRECISION
            and status is not None and status >= SKIP_STATUS)
    why_stop = (f"{stops} predicted failures, precision {precision:.2f}" if stops else "never predicted a failure")
    why_skip = (f"{oks} predicted successes, precision {ok_precision:.2f}" if oks else "never predicted a success")
    return {"stop": stop, "skip_approval": skip, "why": f"{why_stop}; {why_skip}",
            **{k: figures[k] for k in ("calls", "failures", "status_accuracy", "failure_precision", "failure_recall",
                                      "success_precision")}}


def bars() -> dict[str, Any]:
    """The bars `trust_entry` holds tools to, as written beside a trust table."""
    return {"stop": f"at least {MIN_STOPS} predicted failures, of which at least {STOP_PRECISION:.0%} real",
            "skip_approval": f"at least {MIN_SUCCESSES} predicted successes, of which at least {SKIP_PRECISION:.0%} "
                             f"real, status accuracy at least {SKIP_STATUS:.0%}"}


def report(scored: list[Scored]) -> dict[str, Any]:
    """Overall and per-tool figures, and each tool's trust."""
    tools: dict[str, list[Scored]] = {}
    for s in scored:
        tools.setdefault(s.tool, []).append(s)
    per_tool = {name: summarise(rows) for name, rows in sorted(tools.items())}
    calls = [{"run": s.episode, "index": s.index, "tool": s.tool, "failed": s.failed, "predicted": s.predicted,
              "nll_per_token": s.nll / s.tokens if s.tokens else None} for s in scored]
    return {"overall": summarise(scored), "tools": per_tool,
            "trust": {name: trust_entry(figures) for name, figures in per_tool.items()}, "calls": calls}


async def score_calls(policy: Any, calls: list[Observed], sampling: Any,
                      on_call: Callable[[], None] | None = None) -> list[Scored]:
    """Rehearse each call with `policy` (a token policy: transformers or vLLM) as a run would, and score
    its real reply teacher-forced. Rehearsals go out together (the engine batches them)."""
    from envace_mcp.train.sft import reply_target, target_encoding

    encode, end = target_encoding(policy.tokenizer)

    async def one(call: Observed) -> Scored:
        generation = await policy.rehearse(call.request, sampling)
        prediction = generation.parsed
        predicted = prediction.status if prediction is not None else "invalid"
        fields: dict[str, int] = {}
        if not call.failed:
            guess = prediction.result if predicted == "result" else None
            fields = field_split(guess, call.value, call.request.call.arguments, call.earlier)
        # scored under the very prompt the rehearsal answered, closed as its template closes a tool turn
        target = encode(reply_target(call.result, generation.prompt_format, generation.turn_close)) + [end]
        logprobs = await asyncio.to_thread(policy.score, generation.prompt_ids, target)
        if on_call is not None:
            on_call()
        return Scored(call.tool, call.failed, predicted, call.episode, call.index, fields, -sum(logprobs), len(target),
                      generation.text or "")

    return list(await asyncio.gather(*(one(c) for c in calls)))


def finite(value: Any) -> Any:
    """JSON-safe: NaN/inf to None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
