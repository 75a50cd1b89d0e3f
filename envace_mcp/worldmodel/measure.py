"""How well a world model predicts a server's replies, tool by tool, beside what a trivial predictor
scores on the same calls, and the trust it earns.

For each real call (`calls.Observed`) the rehearse role predicts the reply greedily, as runs rehearse,
and scores the real reply teacher-forced. Per tool and overall:

- `status_accuracy` (with its 95 % interval): the predicted status (error or result) is the real one; an
  unusable or unknown rehearsal is wrong. Its `floors`: `always_succeeds` (a predictor that says every
  call succeeds), `majority` (each tool's majority status in the training calls, where known) and, when
  the world model recalls logged calls (`policy.recall`), `nearest_call` (the status of the logged call
  most like it: what the log alone predicts);
- `failure_precision` / `failure_recall`: predicted failures that were real failures / real failures
  that were predicted (None where there was nothing to divide by); `stop_curve`: the same at each P(error)
  threshold, what the trust table's `min_p_error` is chosen from; `calibration`: the reliability of
  P(error) (bins, expected calibration error, Brier score);
- `success_precision`: predicted results that were real results (what may stand in for approval);
- `field_accuracy`: leaf fields of successful replies right, by kind: `echoed` from the call's
  arguments, `read` earlier in the run, `computed` by the server (`fidelity.field_split`); `field_floor`:
  the same for copying the argument, else the latest earlier value, of the field's name
  (`fidelity.copy_split`);
- `nll_per_token`: the real reply's negative log-likelihood per token under the rehearse prompt (one
  forward pass; ECHO's environment-token metric), pooled over calls;
- `unusable`: the share of rehearsals that could not be read; `unknown`: cut at the token budget before
  its status was decided; `cut`: cut after it (a result, its later fields unknown); `off_schema`: a result
  its output schema refuses where decoding does not check (a string's format or pattern);
- per call (`calls`): its prediction and P(error), the fields copy rules set, the status rule that
  decided it, the raw text of an unusable rehearsal, and the real reply's fields it got wrong (`absent`:
  a listing's element it left out; `wrong`: another value; `fidelity.misses`);
- `by_rule`: the calls whose failure a status rule predicted (`policy.status_rules`), and how many failed;
  `model_status_accuracy`: the status accuracy of the model's own predictions, before those rules.

`trust_entry` turns a tool's figures into a trust table entry by `policy.trust`'s bars.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envace_mcp.policy.fidelity import copy_split, field_split, misses
from envace_mcp.policy.trust import THRESHOLDS, earned
from envace_mcp.worldmodel.calls import Observed, logged_like, with_similar

if TYPE_CHECKING:
    from envace_mcp.policy.types import SamplingParams

KINDS = {"echoed": "echoed", "read": "seen", "computed": "new"}
"""Report names of `fidelity.field_split`'s kinds."""
BINS = 5
"""Equal-width bins of P(error) in the reliability table."""
IN_FLIGHT = 16
"""Rehearsals measured at once: enough to batch (a decode step of 12 rows costs 1.3 of one of 7), few
enough that progress moves call by call."""


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
    p_error: float | None = None
    code: str | None = None
    floor_fields: dict[str, int] = field(default_factory=dict)
    """`fidelity.copy_split`: what the trivial copying predictor gets right of the same reply."""
    identity: tuple[str, str] = ("", "")
    """(server, `ToolSpec.behaviour`) of the tool called."""
    nearest_failed: bool | None = None
    """Whether the logged call most like it failed (no logged call of the tool: it succeeds); None without
    a log to recall from."""
    copied: list[str] = field(default_factory=list)
    """Fields of its predicted result set by copy rules (`Prediction.copied`)."""
    ruled: str | None = None
    """The fact by which a status rule predicted its failure (`Prediction.ruled`)."""
    model_predicted: str = ""
    """What the model predicted before the status rules ("": the same as `predicted`)."""
    missed: dict[str, list[str]] = field(default_factory=dict)
    """The real reply's fields the predicted result got wrong, by path (`fidelity.misses`); empty where the
    call failed."""


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def wilson(k: int, n: int, z: float = 1.96) -> list[float] | None:
    """A 95 % interval for a proportion of k in n (Wilson's, sound at 0 and n and for small n)."""
    if not n:
        return None
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def _fields(scored: list[Scored], attribute: str) -> dict[str, list[int]]:
    fields = {name: [0, 0] for name in KINDS}
    for s in scored:
        split = getattr(s, attribute)
        for name, kind in KINDS.items():
            fields[name][0] += split.get(f"{kind}_ok", 0)
            fields[name][1] += split.get(kind, 0)
    return fields


def stop_curve(scored: list[Scored]) -> list[dict[str, Any]]:
    """Precision and recall of stopping the calls predicted to fail at P(error) ≥ t, for each threshold
    (a rehearsal without a P(error) counts at every one)."""
    failed = sum(s.failed for s in scored)
    out = []
    for t in THRESHOLDS:
        stopped = [s for s in scored if s.predicted == "tool_error" and (s.p_error is None or s.p_error >= t)]
        real = sum(s.failed for s in stopped)
        out.append({"p_error": t, "stopped": len(stopped), "precision": _ratio(real, len(stopped)),
                    "recall": _ratio(real, failed)})
    return out


def calibration(scored: list[Scored]) -> dict[str, Any]:
    """Reliability of P(error) over the calls that have one: per bin, how many, the mean P(error) and the
    share that failed; the expected calibration error (bins weighted by size) and the Brier score."""
    rated = [s for s in scored if s.p_error is not None]
    bins = []
    for b in range(BINS):
        low, high = b / BINS, (b + 1) / BINS
        inside = [s for s in rated if low <= s.p_error < high or (b == BINS - 1 and s.p_error == 1.0)]  # type: ignore[operator]
        bins.append({"from": low, "to": high, "calls": len(inside),
                     "mean_p_error": sum(s.p_error for s in inside) / len(inside) if inside else None,  # type: ignore[misc]
                     "failed": _ratio(sum(s.failed for s in inside), len(inside))})
    ece = (sum(b["calls"] * abs(b["mean_p_error"] - b["failed"]) for b in bins if b["calls"]) / len(rated)
           if rated else None)
    brier = sum((s.p_error - s.failed) ** 2 for s in rated) / len(rated) if rated else None  # type: ignore[operator]
    return {"calls": len(rated), "ece": ece, "brier": brier, "bins": bins}


def summarise(scored: list[Scored], majority: dict[str, bool] | None = None) -> dict[str, Any]:
    """The figures of the module's list over `scored` calls, each beside its floor. `majority`: tool ->
    whether most of its training calls failed (None: the training calls are not known)."""
    n = len(scored)
    failed = sum(s.failed for s in scored)
    said_fail = [s for s in scored if s.predicted == "tool_error"]
    said_ok = [s for s in scored if s.predicted == "result"]
    right = sum(_right(s.predicted, s) for s in scored)
    ruled = [s for s in scored if s.ruled]
    fields, floor = _fields(scored, "fields"), _fields(scored, "floor_fields")
    tokens = sum(s.tokens for s in scored)
    majority_right = (sum(majority.get(s.tool, False) == s.failed for s in scored) if majority is not None else None)
    recalled = [s for s in scored if s.nearest_failed is not None]
    nearest = _ratio(sum(s.nearest_failed == s.failed for s in recalled), n) if recalled and len(recalled) == n else None
    return {
        "calls": n, "failures": failed,
        "status_accuracy": _ratio(right, n), "status_interval": wilson(right, n),
        "model_status_accuracy": _ratio(sum(_right(s.model_predicted or s.predicted, s) for s in scored), n),
        "by_rule": {"calls": len(ruled), "failed": sum(s.failed for s in ruled)},
        "floors": {"always_succeeds": _ratio(n - failed, n),
                   "majority": _ratio(majority_right, n) if majority_right is not None else None,
                   **({"nearest_call": nearest} if nearest is not None else {})},
        "failure_precision": _ratio(sum(s.failed for s in said_fail), len(said_fail)),
        "failure_recall": _ratio(sum(s.failed for s in said_fail), failed),
        "success_precision": _ratio(sum(not s.failed for s in said_ok), len(said_ok)),
        "predicted_failures": len(said_fail), "predicted_successes": len(said_ok),
        "unusable": _ratio(sum(s.predicted == "invalid" and s.code != "UNKNOWN" for s in scored), n),
        "unknown": _ratio(sum(s.predicted == "invalid" and s.code == "UNKNOWN" for s in scored), n),
        "cut": _ratio(sum(s.code == "CUT" for s in scored), n),
        "off_schema": _ratio(sum(s.code == "OFF_SCHEMA" for s in scored), n),
        "field_accuracy": {name: _ratio(ok, total) for name, (ok, total) in fields.items()},
        "field_floor": {name: _ratio(ok, total) for name, (ok, total) in floor.items()},
        "fields": {name: total for name, (_, total) in fields.items()},
        "nll_per_token": sum(s.nll for s in scored) / tokens if tokens else None,
        "stop_curve": stop_curve(scored),
        "calibration": calibration(scored),
    }


def _right(predicted: str, s: Scored) -> bool:
    return (predicted == "tool_error") == s.failed and predicted != "invalid"


def trust_entry(figures: dict[str, Any], identities: set[tuple[str, str]]) -> dict[str, Any]:
    """A trust table's entry for one tool: what its held-out figures earn (`policy.trust.earned`), the
    tool's identity, and the figures it rests on."""
    entry = earned(figures)
    if len(identities) != 1:  # two servers' tools of one name, or a schema that changed: one entry cannot bind both
        entry = {"believe_failures": False, "min_p_error": None, "skip_approval": False,
                 "why": f"measured on {len(identities)} different tools of this name, so bound to none"}
    server, behaviour = next(iter(identities)) if len(identities) == 1 else (None, None)
    kept = ("calls", "failures", "status_accuracy", "status_interval", "floors", "failure_precision", "failure_recall",
            "success_precision", "predicted_failures", "predicted_successes", "stop_curve")
    return {**entry, "fail_closed": True, "server": server or None, "behaviour": behaviour or None,
            **{k: figures[k] for k in kept}}


def report(scored: list[Scored], majority: dict[str, bool] | None = None) -> dict[str, Any]:
    """Overall and per-tool figures beside their floors, and each tool's trust."""
    tools: dict[str, list[Scored]] = {}
    for s in scored:
        tools.setdefault(s.tool, []).append(s)
    per_tool = {name: summarise(rows, majority) for name, rows in sorted(tools.items())}
    calls = [{"run": s.episode, "index": s.index, "tool": s.tool, "failed": s.failed, "predicted": s.predicted,
              "p_error": s.p_error, "code": s.code, "nll_per_token": s.nll / s.tokens if s.tokens else None,
              **({"text": s.text} if s.predicted == "invalid" else {}), **({"copied": s.copied} if s.copied else {}),
              **({"ruled": s.ruled, "model_predicted": s.model_predicted} if s.ruled else {}),
              **{kind: paths for kind, paths in s.missed.items() if paths}}
             for s in scored]
    return {"overall": summarise(scored, majority), "tools": per_tool,
            "trust": {name: trust_entry(figures, {s.identity for s in tools[name]}) for name, figures in per_tool.items()},
            "calls": calls}


def majority_of(calls: list[Observed]) -> dict[str, bool]:
    """Tool -> whether most of its `calls` failed (a tie: succeeded): the majority floor's prediction."""
    counts: dict[str, list[int]] = {}
    for call in calls:
        counts.setdefault(call.tool, [0, 0])[call.failed] += 1
    return {tool: failed > ok for tool, (ok, failed) in counts.items()}


async def score_calls(policy: Any, calls: list[Observed], sampling: SamplingParams,
                      on_call: Callable[[], None] | None = None) -> list[Scored]:
    """Rehearse each call with `policy` (a token policy: transformers or vLLM) as a run would, and score
    its real reply teacher-forced. Rehearsals go out together (the engine batches them). The policy's
    status rules are applied here rather than inside its rehearsals, so the model's own prediction is
    scored too (`Scored.model_predicted`)."""
    from envace_mcp.train.sft import reply_target, target_encoding

    encode, end = target_encoding(policy.tokenizer)
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(call: Observed) -> Scored:
        async with slots:
            return await measured(call)

    log = getattr(policy, "recall", None)
    rules = getattr(policy, "status_rules", None)

    async def measured(call: Observed) -> Scored:
        nearest = logged_like(call, log)  # one search: the recalled examples and the nearest-call floor
        request = with_similar(call, log, nearest)
        generation = await policy.rehearse(request, sampling)
        own = generation.parsed
        prediction = rules.apply(own, request) if rules is not None and own is not None else own
        predicted = prediction.status if prediction is not None else "invalid"
        fields: dict[str, int] = {}
        floor: dict[str, int] = {}
        missed: dict[str, list[str]] = {}
        if not call.failed:
            guess = prediction.result if predicted == "result" else None
            fields = field_split(guess, call.value, call.request.call.arguments, call.earlier)
            floor = copy_split(call.value, call.request.call.arguments, call.earlier)
            missed = misses(guess, call.value)
        # scored under the very prompt the rehearsal answered, closed as its template closes a tool turn
        target = encode(reply_target(call.result, generation.prompt_format, generation.turn_close)) + [end]
        logprobs = await asyncio.to_thread(functools.partial(policy.score, reuse_prefix=True),  # (its prompt is cached)
                                           generation.prompt_ids, target)
        if on_call is not None:
            on_call()
        return Scored(call.tool, call.failed, predicted, call.episode, call.index, fields, -sum(logprobs), len(target),
                      generation.text or "", prediction.p_error if prediction is not None else None,
                      prediction.code if prediction is not None else None, floor, (call.spec.server, call.spec.behaviour),
                      None if nearest is None else bool(nearest and nearest[0].failed),
                      list(prediction.copied) if prediction is not None else [],
                      prediction.ruled if prediction is not None else None,
                      own.status if own is not None and own.status != predicted else "", missed)

    if rules is not None:
        policy.status_rules = None
    try:
        return list(await asyncio.gather(*(one(c) for c in calls)))
    finally:
        if rules is not None:
            policy.status_rules = rules


def finite(value: Any) -> Any:
    """JSON-safe: NaN/inf to None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
