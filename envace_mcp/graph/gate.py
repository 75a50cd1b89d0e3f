"""The gate: pure functions deciding, per proposed call, whether it is rehearsed and what happens next.

The gate is code, not text: nothing a tool returns or a model writes can change these rules.

    should_rehearse(spec, mode, config)                          -> bool
    decide(call, spec, prediction, mode=, config=, real_calls=, max_real_calls=, evidence=)  -> Decision

Decisions, in the order they are checked:
1. `reject`   — unknown tool or arguments violating its input schema (answered without any server);
2. `simulate` — simulated mode, or a non-read-only tool in mixed mode: the prediction is the answer;
3. `block`    — a destructive tool whose rehearsal predicts a failure (a policy violation, an error), or,
   with `on_unusable="block"`, could not be read; or, by the run's own evidence (`evidence` rules,
   no model involved), one the real server already refused (`repeated_failures`), one that already
   succeeded since the user's last message (`repeated_writes`) or one with an identifier nobody wrote
   (`ungrounded_arguments`): not executed unless `approve_blocked` routes it to a human (`ask`);
4. `feedback` — the rehearsal predicts an error for any other tool (or blocking is off): not executed,
   the prediction goes back to the agent so it can revise;
5. `budget`   — the run's real-call budget (`RunLimits.max_real_calls`) is spent;
6. `ask`      — the configuration wants a human to approve this call (`interrupt()` shows the call and
   its rehearsed outcome);
7. `execute`  — run it on the real server.

Its settings live in `graph.gate_config`, the evidence rules in `graph.evidence`; the names callers
import from here are re-exported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from envace_mcp.graph.evidence import Evidence, call_key, objection
from envace_mcp.graph.gate_config import ADAPTER_GATE_SETTINGS, UNATTENDED, GateConfig, RunLimits, adapter_gate, gate_for
from envace_mcp.graph.gate_config import gate_settings, gate_text, limits_settings, limits_text, policy_gate
from envace_mcp.policy.types import Prediction, ToolCall
from envace_mcp.toolbox import ToolSpec

__all__ = [  # the settings and evidence names callers import from `graph.gate`
    "ADAPTER_GATE_SETTINGS", "UNATTENDED", "GateConfig", "RunLimits", "adapter_gate", "gate_for", "gate_settings",
    "gate_text", "limits_settings", "limits_text", "policy_gate", "Evidence", "call_key", "objection",
    "Mode", "Action", "Decision", "simulates", "rehearses", "rehearses_real_calls", "should_rehearse", "decide",
]

Mode = Literal["real", "simulated", "mixed"]
Action = Literal["reject", "simulate", "feedback", "block", "budget", "ask", "execute"]


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def simulates(mode: Mode, read_only: bool) -> bool:
    """Whether the rehearsal answers a call instead of the real tool (simulated mode; writes in mixed mode)."""
    return mode == "simulated" or (mode == "mixed" and not read_only)


def rehearses(mode: Mode, config: GateConfig, read_only: bool) -> bool:
    """Whether a call to a tool (read-only or not) is rehearsed before the gate decides."""
    if simulates(mode, read_only):
        return True  # the prediction *is* the answer
    return config.rehearse == "all" or (config.rehearse == "writes" and not read_only)


def rehearses_real_calls(mode: Mode, config: GateConfig) -> bool:
    """Whether any call is both rehearsed and really run, so a rehearsal can meet a real result (what a
    fidelity reward scores): never in simulated mode, nor in mixed mode unless reads are rehearsed."""
    return any(rehearses(mode, config, read_only) and not simulates(mode, read_only) for read_only in (True, False))


def should_rehearse(spec: ToolSpec | None, mode: Mode, config: GateConfig) -> bool:
    """Whether a call to `spec` is rehearsed before the gate decides."""
    return spec is not None and rehearses(mode, config, spec.annotations.read_only)


def decide(
    call: ToolCall,
    spec: ToolSpec | None,
    prediction: Prediction | None,
    *,
    mode: Mode,
    config: GateConfig,
    real_calls: int = 0,
    max_real_calls: int | None = None,
    evidence: Evidence | None = None,
) -> Decision:
    """What happens to one proposed call. Pure: same inputs, same decision. `real_calls` of
    `max_real_calls` (None: no budget) already spent; `evidence`: what the run has seen
    (`Evidence.of(messages)`), for the evidence rules; None skips them."""
    if spec is None:
        return Decision("reject", f"unknown tool '{call.name}'")
    problems = spec.validator.errors(call.arguments)
    if problems:
        where = f"field '{problems[0]['field']}'" if problems[0]["field"] else "arguments"
        return Decision("reject", f"invalid arguments for '{spec.name}': {where}: {problems[0]['message']}")
    if simulates(mode, spec.annotations.read_only):
        return Decision("simulate", f"{mode} mode: the rehearsal answers this call")
    earned = config.trust.get(call.name) if config.trust is not None else None
    if earned is not None and not earned.covers(spec):
        earned = None  # measured on another server's tool of this name, or on another schema
    predicted = prediction is not None and prediction.status == "tool_error"
    unusable = prediction is not None and (prediction.status == "invalid" or prediction.partial)
    confidence = prediction.confidence if prediction is not None else None
    p_error = prediction.p_error if prediction is not None else None
    believed = config.trust is None or (earned is not None and earned.believe_failures and (
        earned.min_p_error is None or p_error is None or p_error >= earned.min_p_error))
    closed = config.trust is None or (earned is not None and earned.fail_closed)
    failing = predicted and (confidence is None or confidence >= config.min_failure_confidence) and believed
    sure = (f" (P(error) {p_error:.2f})" if p_error is not None else
            f" (confidence {confidence:.2f})" if confidence is not None else "")
    shown = ""  # a prediction the trust table says not to act on: said, not acted on
    if (predicted and not believed) or (unusable and not closed):
        measured = ("was not measured on" if earned is None else
                    f"is believed only at P(error) ≥ {earned.min_p_error:g} on" if earned.believe_failures
                    else "was not measured reliable on")
        shown = (f"; the world model {measured} '{spec.name}' (trust table), so its prediction "
                 f"({prediction.code}{sure}) is shown, not acted on")
        unusable = unusable and closed
    seen = objection(call, spec, evidence, config) if evidence is not None and spec.annotations.destructive else None
    if seen:
        if config.approve_blocked:
            return Decision("ask", f"destructive call blocked ({seen}); a human may approve it")
        return Decision("block", f"destructive call blocked: {seen}")
    if spec.annotations.destructive and ((failing and config.block_destructive_on_predicted_failure)
                                         or (unusable and config.on_unusable == "block")):
        why = (f"rehearsal unusable ({prediction.code}), failing closed (on_unusable=block; with on_unusable=allow "
               "approval decides)" if unusable else
               f"rehearsal predicts {prediction.code}{sure}: {prediction.message or prediction.details or 'failure'}")
        if config.approve_blocked:
            return Decision("ask", f"destructive call blocked ({why}); a human may approve it")
        return Decision("block", f"destructive call blocked: {why}")
    if failing and config.feedback_on_predicted_error:
        return Decision("feedback", f"rehearsal predicts {prediction.code}{sure}: "
                                    f"{prediction.message or prediction.details or 'an error'}")
    if max_real_calls is not None and real_calls >= max_real_calls:
        return Decision("budget", f"real-call budget of {max_real_calls} spent")
    vouched = (config.require_approval == "measured" and earned is not None and earned.skip_approval
               and prediction is not None and prediction.status == "result" and not prediction.partial)
    if config.require_approval == "always" or (
            config.require_approval in ("destructive", "measured") and spec.annotations.destructive and not vouched):
        unread = f"; rehearsal unusable ({prediction.code}), so it predicts nothing" if unusable else ""
        return Decision("ask", f"approval required for {'destructive ' if spec.annotations.destructive else ''}"
                               f"tool '{spec.name}'{unread}{shown}")
    if shown:
        return Decision("execute", shown.removeprefix("; "))
    if vouched and spec.annotations.destructive:
        return Decision("execute", f"rehearsal predicts success, and the world model's predicted successes of "
                                   f"'{spec.name}' were measured reliable (require_approval=measured)")
    if predicted and not failing:  # an objection too unsure to count: say so, a reviewer reads this
        return Decision("execute", f"rehearsal predicts {prediction.code} at confidence {confidence:.2f}, under "
                                   f"min_failure_confidence {config.min_failure_confidence:g}")
    if unusable:  # it predicts nothing, so it cannot have raised "no objection"
        return Decision("execute", f"rehearsal unusable ({prediction.code}), so it predicts nothing; run without "
                                   "a prediction (on_unusable=block fails closed)")
    return Decision("execute", "rehearsal raised no objection" if prediction is not None else "not rehearsed")
